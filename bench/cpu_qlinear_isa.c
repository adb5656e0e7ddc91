/*
 * bench/cpu_qlinear_isa.c — the GGUF integer kernels (kernels/cpu/q8dot.h
 * through loom_cpu_qlinear) on every instruction set this CPU has, for
 * every block type they read: the weight bytes of a decode step streamed
 * at batch 1 (and 4 and 16 tokens), so the tiers can be compared on one
 * machine without a model file; and f16 / bf16 weights kept as stored
 * (float activations, so one line each, on the best instruction set).
 *
 *   cpu_qlinear_isa [layers] [threads...]     (defaults: 8 layers; 1 and all cores)
 *
 * A "layer" is a Llama-style block at hidden 1024 / intermediate 2816
 * (multiples of 256, so every k-quant fits): Q, K, V (4 of 16 heads), O,
 * gate + up fused, down — 11.3 M weights. The layers are separate buffers
 * (8 layers of q4_k are ~50 MB, past most caches), called in order as a
 * decode step does. Blocks are random bytes with ordinary scales. Prints
 * one line per (isa, type, threads, tokens): microseconds a step, median of
 * 15 after 3 warm-up steps, and the weight bytes over that time. Not a
 * test: exits 0 unless something failed.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "cpu_kernels.h"
#include "formats/dtype.h"
#include "formats/half.h"
#include "q8dot.h"
#include "qlinear.h"

#define QB_H 1024
#define QB_I 2816
#define QB_KV 256
#define QB_MAXM 16
#define QB_REPS 15

/* q, k, v, o, gate, up, down: the views and the blocks they borrow */
typedef struct qb_layer {
    loom_cpu_qweight w[7];
    void *buf[7];
} qb_layer;

static double qb_now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

static int qb_cmp(const void *a, const void *b) {
    const double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static uint64_t qb_rng = 0x9E3779B97F4A7C15ull;
static uint64_t qb_next(void) {
    qb_rng ^= qb_rng << 13, qb_rng ^= qb_rng >> 7, qb_rng ^= qb_rng << 17;
    return qb_rng;
}

static void qb_f16(uint8_t *p, float v) {
    const uint16_t h = loom_fp32_to_fp16(v);
    memcpy(p, &h, 2);
}

/* Random blocks with the scale fields a real file holds (no NaN / Inf). */
static void *qb_blocks(loom_dtype t, int64_t n, int64_t k) {
    const size_t rb = loom_dtype_row_bytes(t, k), bb = loom_dtype_block_bytes(t);
    uint8_t *d = malloc(rb * (size_t)n);
    if (!d) return NULL;
    for (size_t i = 0; i < rb * (size_t)n; i += 8) {
        const uint64_t v = qb_next();
        memcpy(d + i, &v, rb * (size_t)n - i < 8 ? rb * (size_t)n - i : 8);
    }
    if (t == LOOM_DTYPE_F16 || t == LOOM_DTYPE_BF16) { /* normal values in +-[0.5, 1) */
        for (size_t i = 0; i + 1 < rb * (size_t)n; i += 2) {
            const uint16_t r = (uint16_t)qb_next();
            const uint16_t h = t == LOOM_DTYPE_F16 ? (uint16_t)((r & 0x83FFu) | 0x3800u)
                                                   : (uint16_t)((r & 0x807Fu) | 0x3F00u);
            memcpy(d + i, &h, 2);
        }
        return d;
    }
    for (size_t b = 0; b < rb * (size_t)n / bb; b++) {
        uint8_t *p = d + b * bb;
        if (t == LOOM_DTYPE_Q6_K) qb_f16(p + 208, 0.001f);
        else qb_f16(p, 0.01f);
        if (t == LOOM_DTYPE_Q4_1 || t == LOOM_DTYPE_Q4_K || t == LOOM_DTYPE_Q5_K) qb_f16(p + 2, 0.002f);
    }
    return d;
}

static int qb_weight(loom_cpu_qweight *w, loom_tensor *t, void **buf, loom_dtype dt, int64_t n, int64_t k) {
    *buf = qb_blocks(dt, n, k);
    if (!*buf) return 0;
    *t = (loom_tensor){.struct_size = sizeof *t, .dtype = dt, .ndim = 2, .data = *buf,
                       .nbytes = loom_dtype_row_bytes(dt, k) * (size_t)n, .device = LOOM_DEVICE_HOST};
    t->shape[0] = n, t->shape[1] = k;
    char why[256];
    if (!loom_cpu_qweight_gguf(w, t, why, sizeof why)) {
        fprintf(stderr, "cpu_qlinear_isa: %s: %s\n", loom_dtype_name(dt), why);
        return 0;
    }
    return 1;
}

/* q, k, v, o, gate, up (K = hidden), down (K = intermediate). */
static int qb_make(qb_layer *l, loom_dtype dt) {
    static const int64_t rows[7] = {QB_H, QB_KV, QB_KV, QB_H, QB_I, QB_I, QB_H};
    loom_tensor t[7];
    for (int i = 0; i < 7; i++)
        if (!qb_weight(&l->w[i], &t[i], &l->buf[i], dt, rows[i], i == 6 ? QB_I : QB_H)) return 0;
    return 1;
}

static void qb_free(qb_layer *l) {
    for (int i = 0; i < 7; i++) free(l->buf[i]);
}

/* One decode step over every layer at M tokens: fused QKV, O, fused
 * gate/up, down, as the cpu backend calls them. */
static int qb_step(qb_layer *L, int nl, int64_t M, float *x, float *y, loom_cpu_qscratch *s,
                   loom_cpu_pool *pool) {
    for (int i = 0; i < nl; i++) {
        const loom_cpu_qweight *qkv[3] = {&L[i].w[0], &L[i].w[1], &L[i].w[2]};
        const loom_cpu_qweight *gu[2] = {&L[i].w[4], &L[i].w[5]};
        if (!loom_cpu_qlinear_multi(y, QB_H + 2 * QB_KV, x, QB_H, qkv, NULL, 3, M, 0.0f, s, pool) ||
            !loom_cpu_qlinear(x, QB_H, y, QB_H + 2 * QB_KV, &L[i].w[3], NULL, M, 0.0f, s, pool) ||
            !loom_cpu_qlinear_multi(y, 2 * QB_I, x, QB_H, gu, NULL, 2, M, 0.0f, s, pool) ||
            !loom_cpu_qlinear(x, QB_H, y, 2 * QB_I, &L[i].w[6], NULL, M, 0.0f, s, pool))
            return 0;
        /* keep the activations ordinary: the products grow otherwise */
        for (int64_t j = 0; j < M * QB_H; j++) x[j] = (float)((j * 7 + i) % 17) * 0.05f - 0.4f;
    }
    return 1;
}

static size_t qb_bytes(const qb_layer *L, int nl) {
    size_t b = 0;
    for (int i = 0; i < nl; i++)
        for (int k = 0; k < 7; k++) b += loom_cpu_qweight_bytes(&L[i].w[k]);
    return b;
}

int main(int argc, char **argv) {
    const int nl = argc > 1 ? atoi(argv[1]) : 8;
    int threads[8], nt = 0;
    for (int i = 2; i < argc && nt < 8; i++) threads[nt++] = atoi(argv[i]);
    if (!nt) {
        threads[nt++] = 1;
        const long nc = sysconf(_SC_NPROCESSORS_ONLN);
        if (nc > 1) threads[nt++] = (int)nc;
    }
    if (nl < 1 || nl > 64) {
        fprintf(stderr, "cpu_qlinear_isa: layers %d not in 1..64\n", nl);
        return 2;
    }
    static const loom_dtype types[] = {LOOM_DTYPE_Q4_0, LOOM_DTYPE_Q4_1, LOOM_DTYPE_Q5_0, LOOM_DTYPE_Q8_0,
                                       LOOM_DTYPE_Q4_K, LOOM_DTYPE_Q5_K, LOOM_DTYPE_Q6_K, LOOM_DTYPE_F16,
                                       LOOM_DTYPE_BF16};
    static const char *const isas[] = {"avx512vnni", "avx512", "avx2", "portable"};
    static const int64_t ms[] = {1, 4, 16};
    float *x = calloc((size_t)QB_MAXM * 2 * QB_I, sizeof *x), *y = calloc((size_t)QB_MAXM * 2 * QB_I, sizeof *y);
    qb_layer *L = calloc((size_t)nl, sizeof *L);
    loom_cpu_qscratch *s = loom_cpu_qscratch_create();
    if (!x || !y || !L || !s) return 1;
    printf("best isa here: %s; %d layers of hidden %d / intermediate %d\n", loom_cpu_q8_best_isa(), nl,
           QB_H, QB_I);
    printf("%-11s %-5s %7s %6s %12s %10s\n", "isa", "type", "threads", "tokens", "us/step", "GB/s");
    for (size_t ti = 0; ti < sizeof types / sizeof types[0]; ti++) {
        for (int i = 0; i < nl; i++)
            if (!qb_make(&L[i], types[ti])) return 1;
        const size_t bytes = qb_bytes(L, nl);
        for (int tc = 0; tc < nt; tc++) {
            loom_cpu_pool *pool = loom_cpu_pool_create(threads[tc]);
            /* 16-bit weights run on float activations (target_clones, not
             * q8dot's instruction sets): one line, under the best set */
            const bool f16 = types[ti] == LOOM_DTYPE_F16 || types[ti] == LOOM_DTYPE_BF16;
            bool done = false;
            for (size_t ii = 0; ii < sizeof isas / sizeof isas[0] && !done; ii++) {
                if (!loom_cpu_q8_force_isa(isas[ii])) continue;
                done = f16;
                for (size_t mi = 0; mi < sizeof ms / sizeof ms[0]; mi++) {
                    double t[QB_REPS];
                    for (int r = -3; r < QB_REPS; r++) {
                        for (int64_t j = 0; j < ms[mi] * QB_H; j++) x[j] = (float)(j % 13) * 0.1f - 0.6f;
                        const double t0 = qb_now();
                        if (!qb_step(L, nl, ms[mi], x, y, s, pool)) return 1;
                        if (r >= 0) t[r] = qb_now() - t0;
                    }
                    qsort(t, QB_REPS, sizeof t[0], qb_cmp);
                    printf("%-11s %-5s %7d %6lld %12.1f %10.2f\n", isas[ii], loom_dtype_name(types[ti]),
                           threads[tc], (long long)ms[mi], t[QB_REPS / 2] * 1e6,
                           (double)bytes / t[QB_REPS / 2] * 1e-9);
                    fflush(stdout);
                }
            }
            loom_cpu_pool_destroy(pool);
        }
        for (int i = 0; i < nl; i++) qb_free(&L[i]);
    }
    loom_cpu_q8_force_isa(NULL);
    loom_cpu_qscratch_destroy(s);
    free(L);
    free(x);
    free(y);
    return 0;
}
