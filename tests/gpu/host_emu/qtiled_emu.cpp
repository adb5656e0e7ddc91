// tests/gpu/host_emu/qtiled_emu.cpp — kernels/cuda/qtiled.cu's repack and
// dequantize on the CPU (built and run by qtiled_emu.sh, which cuts the
// device code out of the .cu file into qtiled_part.inc). Random row-major
// codes and scales (zero and negative scales among them), bf16 and f16,
// W8A16 and INT4 at several groups: lc_qtiled_pack_kernel and
// lc_qtiled_scales_kernel make the tiled weight, then
// lc_qtiled_dequant_kernel runs warp by warp with 32 threads (__syncwarp
// through a barrier), at the launcher's grid and at a grid of two CTAs
// (each warp then loops over many tiles, odd tails included); every
// element must equal, bit for bit, the host's decode of the row-major
// codes: INT4 (q - 8) s + b' rounded once to dt from s and b' = b + 8 s in
// dt, W8A16 q s in fp32 rounded to dt — and nothing past the matrix may be
// written.
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <pthread.h>
#include <type_traits>
#include <vector>

#include "formats/half.h" /* the f16 / bf16 conversions CUDA does in hardware */
#include "tests/gpu/host_emu/host_cuda.h"

// ------------------------------------------------ CUDA, as the host sees it
struct __half { uint16_t v; };
struct __nv_bfloat16 { uint16_t v; };
struct dim { unsigned x; };
static thread_local dim threadIdx;
static dim blockIdx, blockDim, gridDim;
static pthread_barrier_t g_bar;
static void __syncwarp() { pthread_barrier_wait(&g_bar); }
static void lc_pdl_wait() {}
static void lc_pdl_trigger() {}
static inline uint4 lc_ldg16(const void *p) { uint4 v; memcpy(&v, p, 16); return v; }
template <typename X> static inline X __ldg(const X *p) { return *p; }

/* dt <-> double; a double rounded once to dt (round to odd into float: its
 * 13+ extra bits leave the float -> dt rounding the only one) */
template <typename T> static double dt_to_d(uint16_t h) {
    return std::is_same<T, __half>::value ? loom_fp16_to_fp32(h) : loom_bf16_to_fp32(h);
}
template <typename T> static uint16_t f_to_dt(float f) {
    return std::is_same<T, __half>::value ? loom_fp32_to_fp16(f) : loom_fp32_to_bf16(f);
}
template <typename T> static uint16_t d_to_dt(double d) {
    float f = (float)d;
    if ((double)f != d) {
        if (std::fabs((double)f) > std::fabs(d)) f = std::nextafterf(f, 0.0f);
        uint32_t u;
        memcpy(&u, &f, 4);
        u |= 1u;
        memcpy(&f, &u, 4);
    }
    return f_to_dt<T>(f);
}
/* packed dt x2 arithmetic, each half rounded once (the products and sums
 * here are exact in double) */
template <typename T> static uint32_t lc_qt_sub2(uint32_t a, uint32_t b) {
    const uint16_t lo = d_to_dt<T>(dt_to_d<T>(a & 0xFFFFu) - dt_to_d<T>(b & 0xFFFFu));
    const uint16_t hi = d_to_dt<T>(dt_to_d<T>(a >> 16) - dt_to_d<T>(b >> 16));
    return lo | (uint32_t)hi << 16;
}
template <typename T> static uint32_t lc_qt_fma2(uint32_t a, uint32_t b, uint32_t c) {
    const uint16_t lo = d_to_dt<T>(dt_to_d<T>(a & 0xFFFFu) * dt_to_d<T>(b & 0xFFFFu) + dt_to_d<T>(c & 0xFFFFu));
    const uint16_t hi = d_to_dt<T>(dt_to_d<T>(a >> 16) * dt_to_d<T>(b >> 16) + dt_to_d<T>(c >> 16));
    return lo | (uint32_t)hi << 16;
}
static inline uint32_t lc_qt_lop3_or_and(uint32_t a, uint32_t mask, uint32_t magic) { return (a & mask) | magic; }
template <typename T> static uint32_t lc_pack2(float a, float b) {
    return f_to_dt<T>(a) | (uint32_t)f_to_dt<T>(b) << 16;
}

#include "qtiled_part.inc"

// ------------------------------------------------------------- helpers
static uint64_t g_rs = 0x5eed;
static uint32_t rnd() {
    g_rs = g_rs * 6364136223846793005ull + 1442695040888963407ull;
    return (uint32_t)(g_rs >> 33);
}
static float unif(float lo, float hi) { return lo + (hi - lo) * (float)(rnd() & 0xFFFFFF) / 16777216.0f; }

template <typename T, bool I4> struct dq_job {
    const uint8_t *wd;
    const float *sc;
    T *out;
    int N, K, group;
    unsigned tid;
};
template <typename T, bool I4> static void *dq_thread(void *p) {
    auto *j = (dq_job<T, I4> *)p;
    threadIdx.x = j->tid;
    lc_qtiled_dequant_kernel<T, I4>(j->wd, j->sc, j->out, j->N, j->K, j->group);
    return nullptr;
}

/* repack, dequantize at `grid` CTAs, compare; returns the elements off */
template <typename T, bool I4> static long check(int N, int K, int group, unsigned grid) {
    const int ng = I4 ? K / group : 1;
    const size_t cb = I4 ? (size_t)N * K / 2 : (size_t)N * K, ns = (size_t)N * (I4 ? 2 * ng : 1);
    std::vector<uint8_t> codes(cb), tiled(cb);
    std::vector<float> sc(ns);
    for (auto &c : codes) c = (uint8_t)rnd();
    for (auto &s : sc) s = rnd() % 16 == 0 ? 0.0f : unif(-0.05f, 0.05f);
    /* the repack, one thread over every vector and pair */
    blockIdx.x = 0, blockDim.x = 1, gridDim.x = 1, threadIdx.x = 0;
    lc_qtiled_pack_kernel(codes.data(), tiled.data(), N, K, I4);
    std::vector<uint32_t> pairs(I4 ? (size_t)N * ng : 0);
    const float *scd = sc.data();
    if (I4) {
        lc_qtiled_scales_kernel<T>(sc.data(), pairs.data(), N, ng);
        scd = reinterpret_cast<const float *>(pairs.data());
    }
    /* the dequantize: 8 warps a CTA, each warp's 32 lanes as threads */
    const size_t total = (size_t)N * K + 64; /* 64 guard elements past the matrix */
    std::vector<T> out(total);
    for (auto &o : out) o.v = 0xFFFF;
    gridDim.x = grid, blockDim.x = LC_QT_DQ_WARPS * 32;
    for (unsigned bx = 0; bx < grid; bx++) {
        blockIdx.x = bx;
        for (unsigned w = 0; w < LC_QT_DQ_WARPS; w++) {
            pthread_barrier_init(&g_bar, nullptr, 32);
            pthread_t th[32];
            dq_job<T, I4> jb[32];
            for (unsigned l = 0; l < 32; l++) {
                jb[l] = {tiled.data(), scd, out.data(), N, K, group, w * 32 + l};
                pthread_create(&th[l], nullptr, dq_thread<T, I4>, &jb[l]);
            }
            for (int l = 0; l < 32; l++) pthread_join(th[l], nullptr);
            pthread_barrier_destroy(&g_bar);
        }
    }
    long bad = 0;
    for (int n = 0; n < N; n++)
        for (int k = 0; k < K; k++) {
            uint16_t ref;
            if (I4) {
                const int q = (codes[(size_t)n * (K / 2) + k / 2] >> (k % 2 * 4)) & 15;
                const float sv = sc[((size_t)n * ng + k / group) * 2], bv = sc[((size_t)n * ng + k / group) * 2 + 1];
                const double s16 = dt_to_d<T>(f_to_dt<T>(sv)), b16 = dt_to_d<T>(f_to_dt<T>(fmaf(8.0f, sv, bv)));
                ref = d_to_dt<T>((double)(q - 8) * s16 + b16);
            } else {
                ref = f_to_dt<T>((float)(int8_t)codes[(size_t)n * K + k] * sc[n]);
            }
            const uint16_t got = out[(size_t)n * K + k].v;
            if (got != ref && bad++ < 3)
                printf("  %s %s N %d K %d group %d grid %u: row %d col %d: host %04x, kernel %04x\n",
                       I4 ? "int4" : "w8a16", std::is_same<T, __half>::value ? "f16" : "bf16", N, K, group, grid, n,
                       k, ref, got);
        }
    for (size_t i = (size_t)N * K; i < total; i++) bad += out[i].v != 0xFFFF;
    return bad;
}

template <typename T, bool I4> static int run(int N, int K, int group) {
    const int KC = I4 ? 64 : 32;
    const size_t ntile = (size_t)(N / 16) * (K / KC), per = 2 * LC_QT_DQ_WARPS;
    const unsigned launcher = (unsigned)((ntile + per - 1) / per);
    int fails = 0;
    for (unsigned grid : {launcher, 2u}) {
        const long bad = check<T, I4>(N, K, group, grid);
        char gs[16] = "";
        if (I4) snprintf(gs, sizeof gs, " g%d", group);
        printf("%s qtiled dequantize %s %s N=%d K=%d%s grid=%u: %ld elements off\n", bad ? "FAIL" : "PASS",
               I4 ? "int4" : "w8a16", std::is_same<T, __half>::value ? "f16" : "bf16", N, K,
               gs, grid, bad);
        fails += bad != 0;
    }
    return fails;
}

int main() {
    int fails = 0;
    fails += run<__nv_bfloat16, true>(64, 1024, 128);
    fails += run<__half, true>(48, 768, 64);
    fails += run<__nv_bfloat16, true>(32, 1536, 1536);
    fails += run<__half, true>(16, 384, 192);
    fails += run<__nv_bfloat16, false>(64, 1024, 0);
    fails += run<__half, false>(48, 384, 0);
    fails += run<__nv_bfloat16, false>(16, 128, 0);
    printf("qtiled_emu: %d failed\n", fails);
    return fails != 0;
}
