/*
 * bench/cpu_smollm2_chain.c — the linear layers of a SmolLM2-135M step on
 * random GGUF blocks, straight through loom_cpu_qlinear: 30 layers of q4_1
 * (fused Q/K/V 576 -> 576 + 2 x 192, O, fused gate/up 576 -> 2 x 1536, down
 * 1536 -> 576) and the 49152 x 576 q8_0 LM head on the last token, as the
 * cpu backend calls them. Isolates the GEMV / small-GEMM kernels from the
 * engine, attention and sampling, for comparing kernel changes on one
 * machine (the weights are separate buffers, 96 MB, past the caches).
 *
 *   cpu_smollm2_chain [threads] [tokens] [reps]   (defaults: 1 thread, 1 token, 30)
 *
 * Prints the best of `reps` steps after 2 warm-up steps: the layers, the LM
 * head, and tokens/s. Not a test: exits 0 unless something failed.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cpu_kernels.h"
#include "formats/dtype.h"
#include "formats/half.h"
#include "q8dot.h"
#include "qlinear.h"

#define SC_H 576
#define SC_KV 192
#define SC_I 1536
#define SC_V 49152
#define SC_LAYERS 30

static uint64_t sc_rng = 0x9E3779B97F4A7C15ull;
static uint64_t sc_next(void) {
    sc_rng ^= sc_rng << 13, sc_rng ^= sc_rng >> 7, sc_rng ^= sc_rng << 17;
    return sc_rng;
}

static double sc_now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

static void sc_f16(uint8_t *p, float v) {
    const uint16_t h = loom_fp32_to_fp16(v);
    memcpy(p, &h, 2);
}

/* (n, k) random blocks of dt with ordinary scales (q4_1: a negative min). */
static int sc_weight(loom_cpu_qweight *w, loom_dtype dt, int64_t n, int64_t k) {
    const size_t rb = loom_dtype_row_bytes(dt, k), bb = loom_dtype_block_bytes(dt), bytes = rb * (size_t)n;
    uint8_t *d = malloc(bytes);
    if (!d) return 0;
    for (size_t i = 0; i < bytes; i++) d[i] = (uint8_t)sc_next();
    for (size_t b = 0; b < bytes / bb; b++) {
        sc_f16(d + b * bb, 0.01f);
        if (dt == LOOM_DTYPE_Q4_1) sc_f16(d + b * bb + 2, -0.002f);
    }
    loom_tensor t = {.struct_size = sizeof t, .dtype = dt, .ndim = 2, .data = d, .nbytes = bytes,
                     .device = LOOM_DEVICE_HOST};
    t.shape[0] = n, t.shape[1] = k;
    char why[256];
    if (!loom_cpu_qweight_gguf(w, &t, why, sizeof why)) {
        fprintf(stderr, "cpu_smollm2_chain: %s\n", why);
        return 0;
    }
    return 1;
}

int main(int argc, char **argv) {
    const int threads = argc > 1 ? atoi(argv[1]) : 1, M = argc > 2 ? atoi(argv[2]) : 1;
    const int reps = argc > 3 ? atoi(argv[3]) : 30;
    if (threads < 1 || M < 1 || reps < 1) {
        fprintf(stderr, "usage: cpu_smollm2_chain [threads >= 1] [tokens >= 1] [reps >= 1]\n");
        return 2;
    }
    static loom_cpu_qweight L[SC_LAYERS][7], head;
    static const int64_t rows[7] = {SC_H, SC_KV, SC_KV, SC_H, SC_I, SC_I, SC_H};
    for (int l = 0; l < SC_LAYERS; l++)
        for (int i = 0; i < 7; i++)
            if (!sc_weight(&L[l][i], LOOM_DTYPE_Q4_1, rows[i], i == 6 ? SC_I : SC_H)) return 1;
    if (!sc_weight(&head, LOOM_DTYPE_Q8_0, SC_V, SC_H)) return 1;
    float *x = malloc(sizeof(float) * (size_t)M * 2 * SC_I), *y = malloc(sizeof(float) * (size_t)M * 2 * SC_I);
    float *logits = malloc(sizeof(float) * SC_V);
    loom_cpu_qscratch *s = loom_cpu_qscratch_create();
    loom_cpu_pool *pool = threads > 1 ? loom_cpu_pool_create(threads) : NULL;
    if (!x || !y || !logits || !s || (threads > 1 && !pool)) return 1;
    double best = 1e30, best_head = 1e30;
    for (int r = 0; r < reps + 2; r++) {
        const double t0 = sc_now();
        for (int l = 0; l < SC_LAYERS; l++) {
            /* ordinary activations each layer (random blocks would grow them) */
            for (int64_t j = 0; j < (int64_t)M * SC_H; j++) x[j] = (float)((j * 7 + l) % 17) * 0.05f - 0.4f;
            const loom_cpu_qweight *qkv[3] = {&L[l][0], &L[l][1], &L[l][2]}, *gu[2] = {&L[l][4], &L[l][5]};
            if (!loom_cpu_qlinear_multi(y, SC_H + 2 * SC_KV, x, SC_H, qkv, NULL, 3, M, 0.0f, s, pool) ||
                !loom_cpu_qlinear(x, SC_H, y, SC_H + 2 * SC_KV, &L[l][3], NULL, M, 0.0f, s, pool) ||
                !loom_cpu_qlinear_multi(y, 2 * SC_I, x, SC_H, gu, NULL, 2, M, 0.0f, s, pool) ||
                !loom_cpu_qlinear(x, SC_H, y, 2 * SC_I, &L[l][6], NULL, M, 0.0f, s, pool))
                return 1;
        }
        const double t1 = sc_now();
        if (!loom_cpu_qlinear(logits, SC_V, x + (int64_t)(M - 1) * SC_H, SC_H, &head, NULL, 1, 0.0f, s, pool))
            return 1;
        const double t2 = sc_now();
        if (r >= 2 && t2 - t0 < best) best = t2 - t0, best_head = t2 - t1;
    }
    printf("cpu_smollm2_chain: isa %s, %d thread(s), %d token(s): best of %d %.2f ms a step "
           "(layers %.2f + LM head %.2f), %.1f tokens/s\n",
           loom_cpu_q8_isa(), threads, M, reps, best * 1e3, (best - best_head) * 1e3, best_head * 1e3, M / best);
    loom_cpu_pool_destroy(pool);
    loom_cpu_qscratch_destroy(s);
    return 0;
}
