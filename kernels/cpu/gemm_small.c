/*
 * kernels/cpu/gemm_small.c — y = x w^T for a handful of rows (batched
 * decode: 2..LOOM_CPU_SMALL_M tokens), streaming the weight exactly once.
 *
 * Why not OpenBLAS: its sgemm packs the whole (N, K) weight into panels
 * before computing, so at M = 2..16 a step costs several weight reads and
 * runs 3-8x slower than one M = 1 GEMV (measured with OpenBLAS 0.3.21 on
 * this project's dev machine; see kernels/cpu/cpu_kernels.h). At small M the
 * work is bound by reading w, so the right kernel reads each weight row once
 * from memory and dots it with all M activation rows while it sits in L1.
 *
 * Micro-kernel: 2 weight rows x 4 activation rows, 8 accumulators of 16
 * floats (GCC vector extensions: one AVX-512 register, two AVX2 ones, four
 * SSE ones); compiled for x86-64-v4, v3 and baseline and picked at load
 * time (target_clones). Rows are spread over the pool in chunks of N.
 */
#include "cpu_kernels.h"

#include <string.h>

#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#define SM_CLONES __attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default")))
#else
#define SM_CLONES
#endif

typedef float sm_v16 __attribute__((vector_size(64)));

/* Unaligned vector load; a macro, as functions passing 64-byte vectors by
 * value would have a target-dependent ABI. */
#define SM_LD(v, p) memcpy(&(v), (p), sizeof(sm_v16))

typedef float sm_v8 __attribute__((vector_size(32)));

/* Transposed reduction of 8 accumulators to their 8 lane sums in 4 levels of
 * shuffle + add (3 ops per sum instead of ~10 for separate horizontal sums;
 * K = 576 is only 36 vector steps, so the reduction is not negligible). Each
 * level halves the partial sums per accumulator and doubles the accumulators
 * per vector; the order is fixed, so results are deterministic. */
#define SM_L1(a, b)                                                                                \
    (__builtin_shufflevector(a, b, 0, 1, 2, 3, 4, 5, 6, 7, 16, 17, 18, 19, 20, 21, 22, 23) +     \
     __builtin_shufflevector(a, b, 8, 9, 10, 11, 12, 13, 14, 15, 24, 25, 26, 27, 28, 29, 30, 31))
#define SM_L2(a, b)                                                                                \
    (__builtin_shufflevector(a, b, 0, 1, 2, 3, 8, 9, 10, 11, 16, 17, 18, 19, 24, 25, 26, 27) +     \
     __builtin_shufflevector(a, b, 4, 5, 6, 7, 12, 13, 14, 15, 20, 21, 22, 23, 28, 29, 30, 31))
#define SM_L3(a, b)                                                                                \
    (__builtin_shufflevector(a, b, 0, 1, 4, 5, 8, 9, 12, 13, 16, 17, 20, 21, 24, 25, 28, 29) +     \
     __builtin_shufflevector(a, b, 2, 3, 6, 7, 10, 11, 14, 15, 18, 19, 22, 23, 26, 27, 30, 31))

/* One accumulator's lane sum in exactly the order SM_L1..SM_L3 and the final
 * pair add give each of the 8 (lanes i + i+8, then + i+4, then + i+2, then
 * + i+1), for the one-row path below: a row's result must not depend on M. */
static inline float sm_hsum1(const sm_v16 *v) {
    sm_v8 u = __builtin_shufflevector(*v, *v, 0, 1, 2, 3, 4, 5, 6, 7) +
              __builtin_shufflevector(*v, *v, 8, 9, 10, 11, 12, 13, 14, 15);
    float w0 = u[0] + u[4], w1 = u[1] + u[5], w2 = u[2] + u[6], w3 = u[3] + u[7];
    return (w0 + w2) + (w1 + w3);
}

typedef struct sm_job {
    float *y;
    int64_t ldy;
    const float *x;
    int64_t ldx;
    const float *w;
    const float *bias;
    int64_t M, K;
    float beta;
} sm_job;

/* Output columns [n0, n1) of all M rows. */
SM_CLONES
static void sm_rows(const sm_job *j, int64_t n0, int64_t n1) {
    const int64_t K = j->K, K16 = K & ~(int64_t)15, M = j->M;
    for (int64_t n = n0; n < n1; n += 2) {
        int nr = n + 1 < n1 ? 2 : 1;
        const float *w0 = j->w + n * K, *w1 = nr == 2 ? w0 + K : w0;
        if (M == 1) {
            /* One activation row (decode at batch 1): two accumulators, the
             * same per-output order as the 4-row tile (lane-wise over K16,
             * the same reduction, scalar tail), so a token computed alone and
             * inside a k+1-row speculative verify get bit-identical results. */
            const float *x0 = j->x;
            sm_v16 a00 = {0}, a10 = {0};
            const float *pf = w0 + 2 * K;
            for (int64_t k = 0; k < K16; k += 16) {
                __builtin_prefetch(pf + k);
                __builtin_prefetch(pf + K + k);
                sm_v16 v0, v1, b0;
                SM_LD(v0, w0 + k), SM_LD(v1, w1 + k), SM_LD(b0, x0 + k);
                a00 += v0 * b0, a10 += v1 * b0;
            }
            float s[2] = {sm_hsum1(&a00), sm_hsum1(&a10)};
            for (int64_t k = K16; k < K; k++) s[0] += w0[k] * x0[k], s[1] += w1[k] * x0[k];
            for (int r = 0; r < nr; r++) {
                float *out = j->y + n + r;
                float v = s[r] + (j->bias ? j->bias[n + r] : 0.0f);
                *out = j->beta != 0.0f ? v + j->beta * *out : v;
            }
            continue;
        }
        for (int64_t m = 0; m < M; m += 4) {
            int mr = M - m < 4 ? (int)(M - m) : 4;
            /* missing rows alias row 0: computed, never stored */
            const float *x0 = j->x + m * j->ldx;
            const float *x1 = mr > 1 ? x0 + j->ldx : x0;
            const float *x2 = mr > 2 ? x0 + 2 * j->ldx : x0;
            const float *x3 = mr > 3 ? x0 + 3 * j->ldx : x0;
            sm_v16 a00 = {0}, a01 = {0}, a02 = {0}, a03 = {0};
            sm_v16 a10 = {0}, a11 = {0}, a12 = {0}, a13 = {0};
            /* the first pass over this pair prefetches the next pair: short
             * rows end the hardware prefetcher's stream too early (+60%) */
            const float *pf = m == 0 ? w0 + 2 * K : NULL;
            for (int64_t k = 0; k < K16; k += 16) {
                if (pf) {
                    __builtin_prefetch(pf + k);
                    __builtin_prefetch(pf + K + k);
                }
                sm_v16 v0, v1, b0, b1, b2, b3;
                SM_LD(v0, w0 + k), SM_LD(v1, w1 + k);
                SM_LD(b0, x0 + k), SM_LD(b1, x1 + k), SM_LD(b2, x2 + k), SM_LD(b3, x3 + k);
                a00 += v0 * b0, a01 += v0 * b1, a02 += v0 * b2, a03 += v0 * b3;
                a10 += v1 * b0, a11 += v1 * b1, a12 += v1 * b2, a13 += v1 * b3;
            }
            sm_v16 r3 = SM_L3(SM_L2(SM_L1(a00, a01), SM_L1(a02, a03)),
                              SM_L2(SM_L1(a10, a11), SM_L1(a12, a13)));
            sm_v8 sums = __builtin_shufflevector(r3, r3, 0, 2, 4, 6, 8, 10, 12, 14) +
                         __builtin_shufflevector(r3, r3, 1, 3, 5, 7, 9, 11, 13, 15);
            float s[2][4] = {{sums[0], sums[1], sums[2], sums[3]}, {sums[4], sums[5], sums[6], sums[7]}};
            for (int64_t k = K16; k < K; k++) {
                s[0][0] += w0[k] * x0[k], s[0][1] += w0[k] * x1[k];
                s[0][2] += w0[k] * x2[k], s[0][3] += w0[k] * x3[k];
                s[1][0] += w1[k] * x0[k], s[1][1] += w1[k] * x1[k];
                s[1][2] += w1[k] * x2[k], s[1][3] += w1[k] * x3[k];
            }
            for (int r = 0; r < nr; r++)
                for (int c = 0; c < mr; c++) {
                    float *out = j->y + (m + c) * j->ldy + n + r;
                    float v = s[r][c] + (j->bias ? j->bias[n + r] : 0.0f);
                    *out = j->beta != 0.0f ? v + j->beta * *out : v;
                }
        }
    }
}

static void sm_task(void *arg, int64_t b, int64_t e, int worker) {
    (void)worker;
    sm_rows(arg, b, e);
}

void loom_cpu_linear_small_m(float *y, int64_t ldy, const float *x, int64_t ldx, const float *w,
                             const float *bias, int64_t M, int64_t N, int64_t K, float beta,
                             loom_cpu_pool *pool) {
    if (M <= 0 || N <= 0) return;
    sm_job j = {.y = y, .ldy = ldy, .x = x, .ldx = ldx, .w = w, .bias = bias, .M = M, .K = K,
                .beta = beta};
    /* ~64 KiB of weight per chunk, an even number of rows */
    int64_t grain = K > 0 ? (16384 / K + 1) & ~(int64_t)1 : 64;
    if (grain < 2) grain = 2;
    loom_cpu_pool_for(pool, N, grain, sm_task, &j);
}
