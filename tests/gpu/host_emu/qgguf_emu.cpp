// tests/gpu/host_emu/qgguf_emu.cpp — kernels/cuda/qgguf.cu on the CPU
// (built and run by qgguf_emu.sh, which cuts the device code out of the .cu
// file into qgguf_part.inc). Two checks on random blocks of every type
// (negative and subnormal f16 scales included), K with partial tiles, rows
// starting at every even byte offset modulo 16:
//   decode: one warp's tile staging (lc_gg_issue / lc_gg_stage, lane by
//     lane) and each lane's prep() / half() then fmaf(q, a, b), as the
//     dequantize kernel does, equal bit for bit to formats/gguf_blocks.h's
//     float32 decode (what formats/dequant.c and the cpu backend run);
//   gemv:  lc_gguf_gemv_kernel itself, warp by warp with 32 threads
//     (__syncwarp and shuffles through a barrier), against float64 sums:
//     error / sum |x w| below 1e-6, and nothing written past its rows.
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <initializer_list>
#include <pthread.h>
#include <vector>

#include "formats/half.h" /* the f16 / bf16 conversions CUDA does in hardware */
#include "tests/gpu/host_emu/host_cuda.h"

// ------------------------------------------------ CUDA, as the host sees it
static inline uint4 lc_ldg16(const void *p) { uint4 v; memcpy(&v, p, 16); return v; }
static inline uint32_t __funnelshift_r(uint32_t lo, uint32_t hi, uint32_t sh) {
    return (uint32_t)((((uint64_t)hi << 32) | lo) >> (sh & 31));
}
static inline float __int_as_float(int i) { float f; memcpy(&f, &i, 4); return f; }
struct __half_raw { unsigned short x; };
struct __half { __half_raw r; __half(__half_raw v) : r(v) {} };
static inline float __half2float(__half h) { return loom_fp16_to_fp32(h.r.x); }
enum { LOOM_CUDA_GGUF_Q8_0 = 3, LOOM_CUDA_GGUF_Q4_0 = 4, LOOM_CUDA_GGUF_Q4_1 = 5,
       LOOM_CUDA_GGUF_Q4_K = 6, LOOM_CUDA_GGUF_Q6_K = 7 };
#define LC_GG_WARPS 4
struct bf16 { uint16_t v; }; /* the activations' element type */
static inline float lc_to_f(bf16 b) { return loom_bf16_to_fp32(b.v); }
template <typename T> T lc_from_f(float);
template <> bf16 lc_from_f<bf16>(float f) { return bf16{loom_fp32_to_bf16(f)}; }
template <typename T> static inline void lc_unpack8(const uint4 &v, float *f) {
    const T *e = reinterpret_cast<const T *>(&v);
    for (int i = 0; i < 8; i++) f[i] = lc_to_f(e[i]);
}
struct dim { int x; };
static thread_local dim threadIdx;
static dim blockIdx;
static pthread_barrier_t g_bar;
static float g_shfl[32];
static thread_local int tl_lane;
static void __syncwarp() { pthread_barrier_wait(&g_bar); }
static float __shfl_xor_sync(unsigned, float v, int o) {
    pthread_barrier_wait(&g_bar);
    g_shfl[tl_lane] = v;
    pthread_barrier_wait(&g_bar);
    const float r = g_shfl[tl_lane ^ o];
    pthread_barrier_wait(&g_bar);
    return r;
}
static void lc_pdl_wait() {}
static void lc_pdl_trigger() {}
static void lc_prefetch_rows(const void *, int, size_t, int) {} /* an L2 hint: nothing on a CPU */

#include "codes.inc"
#include "formats/gguf_blocks.h"
#include "qgguf_part.inc"

// ---------------------------- formats/gguf_blocks.h's host decode, per block
static void ref_decode(int t, const uint8_t *b, int K, float *y) {
    const int be = t == LOOM_CUDA_GGUF_Q4_K || t == LOOM_CUDA_GGUF_Q6_K ? 256 : 32;
    for (int i = 0; i < K / be; i++, y += be) {
        switch (t) {
        case LOOM_CUDA_GGUF_Q8_0: loom_gguf_dec_q8_0(b, y), b += LOOM_GGUF_Q8_0_BYTES; break;
        case LOOM_CUDA_GGUF_Q4_0: loom_gguf_dec_q4_0(b, y), b += LOOM_GGUF_Q4_0_BYTES; break;
        case LOOM_CUDA_GGUF_Q4_1: loom_gguf_dec_q4_1(b, y), b += LOOM_GGUF_Q4_1_BYTES; break;
        case LOOM_CUDA_GGUF_Q4_K: loom_gguf_dec_q4_k(b, y), b += LOOM_GGUF_Q4_K_BYTES; break;
        case LOOM_CUDA_GGUF_Q6_K: loom_gguf_dec_q6_k(b, y), b += LOOM_GGUF_Q6_K_BYTES; break;
        }
    }
}

// ------------------------------------------------------------- helpers
static uint64_t g_rs = 0x5eed;
static uint32_t rnd() {
    g_rs = g_rs * 6364136223846793005ull + 1442695040888963407ull;
    return (uint32_t)(g_rs >> 33);
}

/* rows x K random blocks of TYPE at an even offset `mis` past a 16-byte
 * boundary; f16 scales keep their sign and stay finite (exponent <= 14). */
template <int TYPE> static uint8_t *make_rows(std::vector<uint8_t> &mem, int K, int rows, int mis) {
    using G = lc_gt<TYPE>;
    const size_t rb = (size_t)(K / G::ELEMS) * G::BB;
    mem.assign(rows * rb + 64, 0);
    for (auto &b : mem) b = (uint8_t)rnd();
    uint8_t *seg = (uint8_t *)(((uintptr_t)mem.data() + 15) & ~(uintptr_t)15) + mis;
    for (int r = 0; r < rows; r++)
        for (int bl = 0; bl < K / G::ELEMS; bl++) {
            uint8_t *b = seg + r * rb + bl * G::BB;
            if (TYPE == LOOM_CUDA_GGUF_Q6_K) b[209] &= 0xbb;
            else b[1] &= 0xbb;
            if (TYPE == LOOM_CUDA_GGUF_Q4_1 || TYPE == LOOM_CUDA_GGUF_Q4_K) b[3] &= 0xbb;
        }
    return seg;
}

// -------------------------------------------------------------- decode
template <int TYPE> static long check_decode(int K, int rows, int mis) {
    using G = lc_gt<TYPE>;
    std::vector<uint8_t> mem;
    uint8_t *seg = make_rows<TYPE>(mem, K, rows, mis);
    const size_t rb = (size_t)(K / G::ELEMS) * G::BB;
    std::vector<float> ref(K), got(K);
    long bad = 0;
    const int nsb = K >> 5, ntiles = (nsb + 31) >> 5;
    for (int r = 0; r < rows; r++) {
        ref_decode(TYPE, seg + r * rb, K, ref.data());
        const uint8_t *wr[1] = {seg + r * rb};
        for (int t = 0; t < ntiles; t++) {
            static uint32_t sm[1][1][G::SM16 * 4];
            memset(sm, 0xcd, sizeof sm);
            int off = -1;
            for (int lane = 0; lane < 32; lane++) {
                uint4 ld[1][G::LD];
                int o[1];
                lc_gg_issue<TYPE, 1>(wr, rb, t, lane, ld, o);
                lc_gg_stage<TYPE, 1>(sm[0], lane, ld);
                off = o[0];
            }
            for (int lane = 0; lane < 32; lane++) {
                const int sb = (t << 5) + lane;
                if (sb >= nsb) continue;
                lc_gg_sub<TYPE> st;
                st.prep(sm[0][0], off + (lane / G::SUBS) * G::BB, lane % G::SUBS);
                for (int h = 0; h < 2; h++) {
                    float q[16], a, b;
                    st.half(sm[0][0], h, q, a, b);
                    for (int e = 0; e < 16; e++) got[sb * 32 + h * 16 + e] = fmaf(q[e], a, b);
                }
            }
        }
        for (int k = 0; k < K; k++)
            if (memcmp(&ref[k], &got[k], 4) != 0 && bad++ < 3)
                printf("  decode type %d K %d row %d col %d: cpu %.9g, kernel %.9g\n", TYPE, K, r, k,
                       ref[k], got[k]);
    }
    return bad;
}

// ---------------------------------------------------------------- gemv
template <int TYPE, int M, int R> struct job {
    const bf16 *x;
    const uint8_t *wd;
    int rows, K;
    float *y;
    int ldy, warp, lane;
};
template <int TYPE, int M, int R> static void *gemv_thread(void *p) {
    auto *j = (job<TYPE, M, R> *)p;
    threadIdx.x = j->warp * 32 + j->lane;
    tl_lane = j->lane;
    lc_gguf_gemv_kernel<bf16, TYPE, M, R>(j->x, j->wd, j->rows, j->K, j->y, j->ldy, 1, 0);
    return nullptr;
}

template <int TYPE, int M, int R> static double check_gemv(int K, int rows, int mis) {
    using G = lc_gt<TYPE>;
    std::vector<uint8_t> mem;
    uint8_t *seg = make_rows<TYPE>(mem, K, rows, mis);
    const size_t rb = (size_t)(K / G::ELEMS) * G::BB;
    std::vector<bf16> x((size_t)M * K);
    std::vector<float> xf((size_t)M * K);
    for (size_t i = 0; i < x.size(); i++) {
        x[i] = lc_from_f<bf16>((float)((int)(rnd() % 2001) - 1000) / 500.0f);
        xf[i] = lc_to_f(x[i]);
    }
    const int ldy = rows + 3; /* columns past the rows must stay untouched */
    std::vector<float> y((size_t)M * ldy, NAN);
    const int per_cta = LC_GG_WARPS * R, grid = (rows + per_cta - 1) / per_cta;
    for (int bx = 0; bx < grid; bx++) {
        blockIdx.x = bx;
        for (int w = 0; w < LC_GG_WARPS; w++) {
            if ((bx * LC_GG_WARPS + w) * R >= rows) continue; /* returns before any sync */
            pthread_barrier_init(&g_bar, nullptr, 32);
            pthread_t t[32];
            job<TYPE, M, R> jb[32];
            for (int l = 0; l < 32; l++) {
                jb[l] = {x.data(), seg, rows, K, y.data(), ldy, w, l};
                pthread_create(&t[l], nullptr, gemv_thread<TYPE, M, R>, &jb[l]);
            }
            for (int l = 0; l < 32; l++) pthread_join(t[l], nullptr);
            pthread_barrier_destroy(&g_bar);
        }
    }
    std::vector<float> w(K);
    double worst = 0;
    for (int n = 0; n < rows; n++) {
        ref_decode(TYPE, seg + n * rb, K, w.data());
        for (int m = 0; m < M; m++) {
            double ref = 0, mag = 0;
            for (int k = 0; k < K; k++) {
                ref += (double)xf[(size_t)m * K + k] * w[k];
                mag += fabs((double)xf[(size_t)m * K + k] * w[k]);
            }
            const double e = fabs(y[(size_t)m * ldy + n] - ref) / (mag > 1e-30 ? mag : 1e-30);
            if (!(e <= worst)) worst = e;
        }
    }
    for (int m = 0; m < M; m++)
        for (int n = rows; n < ldy; n++)
            if (!std::isnan(y[(size_t)m * ldy + n])) worst = INFINITY;
    return worst;
}

int main() {
    long bad = 0;
    for (int mis = 0; mis < 16; mis += 2) {
        for (int K : {32, 64, 576, 1024, 1056, 4096}) {
            bad += check_decode<LOOM_CUDA_GGUF_Q4_0>(K, 5, mis);
            bad += check_decode<LOOM_CUDA_GGUF_Q4_1>(K, 5, mis);
            bad += check_decode<LOOM_CUDA_GGUF_Q8_0>(K, 5, mis);
        }
        for (int K : {256, 768, 1024, 2304, 4096}) {
            bad += check_decode<LOOM_CUDA_GGUF_Q4_K>(K, 4, mis);
            bad += check_decode<LOOM_CUDA_GGUF_Q6_K>(K, 4, mis);
        }
    }
    printf("%s decode: %ld values differ from the CPU's (bit for bit)\n", bad ? "FAIL" : "PASS", bad);
    double worst = 0;
    auto keep = [&](double e) { if (!(e <= worst)) worst = e; };
    for (int mis : {0, 2, 6, 14}) {
        keep(check_gemv<LOOM_CUDA_GGUF_Q4_0, 1, 2>(1056, 9, mis));
        keep(check_gemv<LOOM_CUDA_GGUF_Q4_0, 1, 2>(32, 3, mis));
        keep(check_gemv<LOOM_CUDA_GGUF_Q4_1, 3, 2>(576, 11, mis));
        keep(check_gemv<LOOM_CUDA_GGUF_Q8_0, 5, 4>(1056, 13, mis));
        keep(check_gemv<LOOM_CUDA_GGUF_Q4_K, 2, 2>(2304, 7, mis));
        keep(check_gemv<LOOM_CUDA_GGUF_Q4_K, 7, 4>(256, 5, mis));
        keep(check_gemv<LOOM_CUDA_GGUF_Q6_K, 8, 4>(768, 17, mis));
    }
    const bool ok = worst < 1e-6;
    printf("%s gemv: worst |y - ref| / sum |x w| %.3e\n", ok ? "PASS" : "FAIL", worst);
    return bad || !ok;
}
