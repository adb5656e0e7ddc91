/*
 * tests/gpu/test_gpu_kernels.c — every kernel of kernels/cuda against a
 * float64 CPU reference, on fresh random inputs, at many shapes. Runs only
 * on a machine with a Hopper GPU (it is not a meson test(): CI has none).
 *
 *   gpu_kernel_tests [seed]        (default seed: from the clock; printed)
 *
 * Each check prints `PASS|FAIL <name> <err>` where err is the largest
 * row-wise relative error ||out - ref|| / ||ref|| over the rows checked
 * (bf16/f16 outputs pass below 1e-2, float32 ones below 1e-5). Outputs are
 * poisoned (all bytes 0xFF: NaN in every float type) before each run, so an
 * element the kernel failed to write fails the check; the split-K workspace
 * is poisoned too. Exit status is the number of failures (0 = all passed).
 * The quantized linear layers (qgemm: int8 W8A16 / W8A8, fp8, int4) are
 * checked against float64 sums over the same quantized weights and
 * activations (test_qgemm); GGUF blocks as stored (q4_0, q4_1, q4_k, q6_k,
 * q8_0, one type or a fused group of several) against float64 sums over
 * the values decoded here from the same random blocks (test_qgemm_gguf),
 * and their dequantize-to-dt kernel bit for bit against the CPU's decode
 * rounded to dt (test_gguf_dequant).
 *
 * FP8 KV cache (E4M3 codes, scale 1.0, the cpu backend's bits): the
 * attention checks rerun on a cache of random codes (`... e4m3-KV ...`; the
 * float64 reference reads the same decoded values, so the tolerance is the
 * bf16 one: the decode shape's f16 products round only P differently, to
 * f16's 11 significant bits instead of bf16's 8, and a bf16 query is
 * converted exactly — checked at queries of 2^24 and 2^-24, `q*2^`); rope_kv's E4M3 write against the host encoder (formats/e4m3.h,
 * checked against float64 by tests/kernels): bit for bit where the kernel's
 * float32 value is known exactly (V, and K at position 0 — with specials:
 * +-0, +-inf, NaN, saturation, ties, subnormal codes), within the float32
 * rounding of the rotation elsewhere; the attention kernels' decoder on all 256 codes
 * (`e4m3 decode ...`, bit for bit; the NaN codes read as +-480).
 *
 * Batch invariance (the backend's batch_invariant mode): the invariant
 * attention call, the invariant GEMV / quantized GEMV and the logits top-k
 * must give a token's row the same bits whether it is computed alone or
 * with other rows, tokens and sequences (`... invariant ...` checks, err =
 * elements that differ, must be 0). `INFO` lines count what the ordinary
 * dispatch changes in the same comparison (expected non-zero; not checks).
 */
#include <math.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <cuda_runtime_api.h>

#include "cuda_kernels.h"
#include "qgemm.h" /* lc_gguf_dequant: checked bit for bit */
#include "qlinear.h"
#include "gpu_util.h"
#include "formats/dequant.h"
#include "formats/e4m3.h"
#include "formats/half.h"
#include "plugin/host_rules.h"

static int g_fail, g_pass;

#define CK(call)                                                                                   \
    do {                                                                                           \
        cudaError_t e_ = (call);                                                                   \
        if (e_ != cudaSuccess) {                                                                   \
            fprintf(stderr, "%s:%d: %s failed: %s (%s)\n", __FILE__, __LINE__, #call,              \
                    cudaGetErrorName(e_), cudaGetErrorString(e_));                                 \
            exit(100); /* a test program, not a library: stop at a device fault */               \
        }                                                                                          \
    } while (0)

/* ---------------------------------------------------------------- helpers */

static int rng_int(int n) { return (int)(gpu_rng_next() % (uint64_t)n); }

/* dt values <-> float: formats/half.h (round to nearest even). */
static uint16_t to16(loom_cuda_dt dt, float f) {
    return dt == LOOM_CUDA_F16 ? loom_fp32_to_fp16(f) : loom_fp32_to_bf16(f);
}
static float from16(loom_cuda_dt dt, uint16_t v) {
    return dt == LOOM_CUDA_F16 ? loom_fp16_to_fp32(v) : loom_bf16_to_fp32(v);
}
static const char *dtn(loom_cuda_dt dt) { return dt == LOOM_CUDA_F16 ? "f16" : "bf16"; }

/* n random 16-bit values in [lo, hi), rounded; `shadow` (may be NULL) gets
 * their exact float values. */
static uint16_t *rand16(loom_cuda_dt dt, size_t n, float lo, float hi, float *shadow) {
    uint16_t *v = malloc(n * 2);
    for (size_t i = 0; i < n; i++) {
        v[i] = to16(dt, gpu_rng_unif(lo, hi));
        if (shadow) shadow[i] = from16(dt, v[i]);
    }
    return v;
}

static void *dev_upload(const void *h, size_t bytes) {
    void *d = NULL;
    CK(cudaMalloc(&d, bytes ? bytes : 16));
    if (bytes) CK(cudaMemcpy(d, h, bytes, cudaMemcpyHostToDevice));
    return d;
}
static void *dev_poison(size_t bytes) {
    void *d = NULL;
    CK(cudaMalloc(&d, bytes ? bytes : 16));
    CK(cudaMemset(d, 0xff, bytes ? bytes : 16));
    return d;
}

/* Row-wise relative error accumulator. */
typedef struct err_acc {
    double worst;
    bool nan;
    long rows;
} err_acc;

static void err_row(err_acc *a, const double *out, const double *ref, int64_t n) {
    double d = 0, r = 0;
    for (int64_t i = 0; i < n; i++) {
        if (isnan(out[i]) || isinf(out[i])) a->nan = true;
        d += (out[i] - ref[i]) * (out[i] - ref[i]);
        r += ref[i] * ref[i];
    }
    double e = sqrt(d) / (sqrt(r) > 1e-30 ? sqrt(r) : 1e-30);
    if (!(e <= a->worst)) a->worst = e; /* NaN propagates as worst */
    a->rows++;
}

static void report(const char *name, const err_acc *a, double tol) {
    bool ok = !a->nan && a->worst <= tol && a->rows > 0;
    printf("%s %-58s %.3e%s\n", ok ? "PASS" : "FAIL", name, a->worst,
           a->nan ? " (NaN/unwritten)" : a->rows == 0 ? " (nothing checked)" : "");
    fflush(stdout);
    if (ok) g_pass++;
    else g_fail++;
}

/* PASS when none of `checked` things was counted bad (err = the count). */
static void report_count(const char *name, long bad, long checked) {
    err_acc a = {.worst = (double)bad, .rows = checked};
    report(name, &a, 0.0);
}

#define TOL16 1e-2
#define TOL32 1e-5

/* ------------------------------------------------------------ E4M3 codes */

/* formats/e4m3.h's codec: the cpu backend's bits. */
static uint8_t e4m3_enc(float f) { return loom_fp32_to_e4m3(f); }
static double e4m3_dec(uint8_t c) { return (double)loom_e4m3_to_fp32(c); }

/* Element type of the KV caches the attention checks build (set around a
 * block of checks in main). */
static loom_cuda_kv g_kv = LOOM_CUDA_KV_DT;
static const char *kvn(void) { return g_kv == LOOM_CUDA_KV_E4M3 ? " e4m3-KV" : ""; }

/* Sliding window of the attention checks (0: whole context), set like g_kv. */
static int g_window;

/* Range of the attention checks' queries: 2^g_qexp times [-1, 1), with the
 * softmax scale divided by 2^g_qexp (the same scores): a bf16 query beyond
 * f16's range (2^24) or below its normal range (2^-24), which the E4M3
 * decode shape's f16 products must take exactly (attention.cu). */
static int g_qexp;

/* Sink data for the attention checks (set like g_kv): every query
 * element 27 ln 2 / sqrt(D) (rounded to dt), key 0 of each sequence all
 * ones with a zero value, every other key zero with a value of ones — so
 * each other key's weight is ~2^-27 of the sink's and the outputs are their
 * total weight, ~2^-27 (ctx - 1): what P rounded to f16 loses when it
 * flushes weights below f16's subnormals (attention.cu). */
static bool g_sink;

/* First key position p sees under g_window. */
static int win_lo(int p) { return g_window > 0 && p - g_window + 1 > 0 ? p - g_window + 1 : 0; }

/* n random cache elements of g_kv in [-1, 1): dt values, or the E4M3 codes
 * of such values; `shadow` (may be NULL) gets their exact float values. */
static void *rand_kv(loom_cuda_dt dt, size_t n, float *shadow) {
    if (g_kv != LOOM_CUDA_KV_E4M3) return rand16(dt, n, -1, 1, shadow);
    uint8_t *c = malloc(n);
    for (size_t i = 0; i < n; i++) {
        c[i] = e4m3_enc(gpu_rng_unif(-1, 1));
        if (shadow) shadow[i] = (float)e4m3_dec(c[i]);
    }
    return c;
}

/* -------------------------------------------------------------- embedding */

/* holes: every other id is -1 (a tensor-parallel rank's token outside its
 * vocabulary slice), whose row must come out zero. */
static void test_embedding(loom_cuda_dt dt, int V, int H, int T, bool holes) {
    float *tab_f = malloc((size_t)V * H * sizeof(float));
    uint16_t *tab = rand16(dt, (size_t)V * H, -1, 1, tab_f);
    int32_t *ids = malloc((size_t)T * 4);
    for (int t = 0; t < T; t++) ids[t] = holes && t % 2 ? -1 : rng_int(V);
    void *d_tab = dev_upload(tab, (size_t)V * H * 2), *d_ids = dev_upload(ids, (size_t)T * 4);
    float *d_x = dev_poison((size_t)T * H * 4);
    CK(loom_cuda_embedding(dt, d_x, d_tab, d_ids, T, H, 0));
    CK(cudaDeviceSynchronize());
    float *x = malloc((size_t)T * H * 4);
    CK(cudaMemcpy(x, d_x, (size_t)T * H * 4, cudaMemcpyDeviceToHost));
    err_acc a = {0};
    double *o = malloc((size_t)H * 8), *r = malloc((size_t)H * 8);
    for (int t = 0; t < T; t++) {
        for (int i = 0; i < H; i++)
            o[i] = x[(size_t)t * H + i], r[i] = ids[t] < 0 ? 0.0 : tab_f[(size_t)ids[t] * H + i];
        err_row(&a, o, r, H);
    }
    char name[128];
    snprintf(name, sizeof name, "embedding %s V=%d H=%d T=%d%s", dtn(dt), V, H, T,
             holes ? " (ids -1: zero rows)" : "");
    report(name, &a, TOL32);
    cudaFree(d_tab), cudaFree(d_ids), cudaFree(d_x);
    free(tab_f), free(tab), free(ids), free(x), free(o), free(r);
}

/* ----------------------------------------------------------- add+RMSNorm */

/* mode 0: y = norm(x); 1: x += r, y = norm(x); 2: gather rows of x + r. */
static void test_rmsnorm(loom_cuda_dt dt, int H, int T, int mode) {
    const int R = mode == 2 ? T + 5 : T; /* input rows */
    const float eps = 1e-5f;
    float *x = malloc((size_t)R * H * 4), *w = malloc((size_t)H * 4);
    float *r_f = malloc((size_t)R * H * 4);
    for (size_t i = 0; i < (size_t)R * H; i++) x[i] = gpu_rng_unif(-2, 2);
    for (int i = 0; i < H; i++) w[i] = gpu_rng_unif(0.5f, 1.5f);
    uint16_t *r = rand16(dt, (size_t)R * H, -1, 1, r_f);
    int32_t *rows = malloc((size_t)T * 4);
    for (int i = 0; i < T; i++) rows[i] = (i * 7 + 3) % R; /* any order, repeats allowed */
    float *d_x = dev_upload(x, (size_t)R * H * 4), *d_w = dev_upload(w, (size_t)H * 4);
    void *d_r = dev_upload(r, (size_t)R * H * 2), *d_rows = dev_upload(rows, (size_t)T * 4);
    void *d_y = dev_poison((size_t)T * H * 2);
    CK(loom_cuda_add_rmsnorm(dt, d_y, d_x, mode ? d_r : NULL, d_w, mode == 2 ? d_rows : NULL, T, H,
                             eps, 0));
    CK(cudaDeviceSynchronize());
    uint16_t *y = malloc((size_t)T * H * 2);
    float *x2 = malloc((size_t)R * H * 4);
    CK(cudaMemcpy(y, d_y, (size_t)T * H * 2, cudaMemcpyDeviceToHost));
    CK(cudaMemcpy(x2, d_x, (size_t)R * H * 4, cudaMemcpyDeviceToHost));
    err_acc ay = {0}, ax = {0};
    double *v = malloc((size_t)H * 8), *o = malloc((size_t)H * 8), *ref = malloc((size_t)H * 8);
    for (int i = 0; i < T; i++) {
        int j = mode == 2 ? rows[i] : i;
        double ss = 0;
        for (int k = 0; k < H; k++) {
            v[k] = (double)x[(size_t)j * H + k] + (mode ? (double)r_f[(size_t)j * H + k] : 0.0);
            ss += v[k] * v[k];
        }
        double inv = 1.0 / sqrt(ss / H + eps);
        for (int k = 0; k < H; k++) {
            ref[k] = v[k] * inv * w[k];
            o[k] = from16(dt, y[(size_t)i * H + k]);
        }
        err_row(&ay, o, ref, H);
        /* x: advanced in place in mode 1, untouched otherwise */
        for (int k = 0; k < H; k++) {
            o[k] = x2[(size_t)j * H + k];
            ref[k] = mode == 1 ? v[k] : x[(size_t)j * H + k];
        }
        err_row(&ax, o, ref, H);
    }
    char name[128];
    static const char *mn[] = {"rmsnorm", "add_rmsnorm", "add_rmsnorm_gather"};
    snprintf(name, sizeof name, "%s %s H=%d T=%d (y)", mn[mode], dtn(dt), H, T);
    report(name, &ay, TOL16);
    snprintf(name, sizeof name, "%s %s H=%d T=%d (x)", mn[mode], dtn(dt), H, T);
    report(name, &ax, TOL32);
    cudaFree(d_x), cudaFree(d_w), cudaFree(d_r), cudaFree(d_rows), cudaFree(d_y);
    free(x), free(w), free(r_f), free(r), free(rows), free(y), free(x2), free(v), free(o), free(ref);
}

/* ----------------------------------------------------------------- SwiGLU */

/* SwiGLU, or (gelu) GeGLU with tanh GELU, against float64. */
static void test_swiglu(loom_cuda_dt dt, int I, int T, bool gelu) {
    float *gu_f = malloc((size_t)T * 2 * I * 4);
    uint16_t *gu = rand16(dt, (size_t)T * 2 * I, -4, 4, gu_f);
    void *d_gu = dev_upload(gu, (size_t)T * 2 * I * 2), *d_o = dev_poison((size_t)T * I * 2);
    CK(gelu ? loom_cuda_geglu_tanh(dt, d_o, d_gu, T, I, 0) : loom_cuda_swiglu(dt, d_o, d_gu, T, I, 0));
    CK(cudaDeviceSynchronize());
    uint16_t *o = malloc((size_t)T * I * 2);
    CK(cudaMemcpy(o, d_o, (size_t)T * I * 2, cudaMemcpyDeviceToHost));
    err_acc a = {0};
    double *out = malloc((size_t)I * 8), *ref = malloc((size_t)I * 8);
    for (int t = 0; t < T; t++) {
        for (int i = 0; i < I; i++) {
            double g = gu_f[(size_t)t * 2 * I + i], u = gu_f[(size_t)t * 2 * I + I + i];
            ref[i] = gelu ? 0.5 * g * (1.0 + tanh(sqrt(2.0 / M_PI) * (g + 0.044715 * g * g * g))) * u
                          : g / (1.0 + exp(-g)) * u;
            out[i] = from16(dt, o[(size_t)t * I + i]);
        }
        err_row(&a, out, ref, I);
    }
    char name[128];
    snprintf(name, sizeof name, "%s %s I=%d T=%d", gelu ? "geglu_tanh" : "swiglu", dtn(dt), I, T);
    report(name, &a, TOL16);
    cudaFree(d_gu), cudaFree(d_o);
    free(gu_f), free(gu), free(o), free(out), free(ref);
}

/* Post-norm residual add x += rmsnorm(r) * w against float64, and the
 * scaled embedding lookup. */
static void test_add_normed(loom_cuda_dt dt, int H, int T) {
    float *x = malloc((size_t)T * H * 4), *rf = malloc((size_t)T * H * 4), *w = malloc((size_t)H * 4);
    for (size_t i = 0; i < (size_t)T * H; i++) x[i] = gpu_rng_unif(-3, 3);
    for (int i = 0; i < H; i++) w[i] = gpu_rng_unif(0.5f, 1.5f);
    uint16_t *r = rand16(dt, (size_t)T * H, -20, 20, rf); /* far from unit scale: the norm matters */
    float *d_x = dev_upload(x, (size_t)T * H * 4);
    void *d_r = dev_upload(r, (size_t)T * H * 2), *d_w = dev_upload(w, (size_t)H * 4);
    const float eps = 1e-6f;
    CK(loom_cuda_add_normed(dt, d_x, d_r, d_w, T, H, eps, 0));
    CK(cudaDeviceSynchronize());
    float *x2 = malloc((size_t)T * H * 4);
    CK(cudaMemcpy(x2, d_x, (size_t)T * H * 4, cudaMemcpyDeviceToHost));
    err_acc a = {0};
    double *out = malloc((size_t)H * 8), *ref = malloc((size_t)H * 8);
    for (int t = 0; t < T; t++) {
        double ss = 0;
        for (int i = 0; i < H; i++) ss += (double)rf[(size_t)t * H + i] * rf[(size_t)t * H + i];
        const double inv = 1.0 / sqrt(ss / H + eps);
        for (int i = 0; i < H; i++) {
            ref[i] = x[(size_t)t * H + i] + rf[(size_t)t * H + i] * inv * w[i];
            out[i] = x2[(size_t)t * H + i];
        }
        err_row(&a, out, ref, H);
    }
    char name[128];
    snprintf(name, sizeof name, "add_normed %s H=%d T=%d", dtn(dt), H, T);
    report(name, &a, TOL32);
    /* the scaled lookup: table row times the scale, in float32 */
    const int V = 300;
    float *tab_f = malloc((size_t)V * H * 4);
    uint16_t *tab = rand16(dt, (size_t)V * H, -1, 1, tab_f);
    int32_t *ids = malloc((size_t)T * 4);
    for (int t = 0; t < T; t++) ids[t] = t % 3 == 2 ? -1 : rng_int(V);
    void *d_tab = dev_upload(tab, (size_t)V * H * 2), *d_ids = dev_upload(ids, (size_t)T * 4);
    const float sc = sqrtf((float)H);
    CK(loom_cuda_embedding_scaled(dt, d_x, d_tab, d_ids, T, H, sc, 0));
    CK(cudaMemcpy(x2, d_x, (size_t)T * H * 4, cudaMemcpyDeviceToHost));
    long bad = 0;
    for (int t = 0; t < T; t++)
        for (int i = 0; i < H; i++) {
            const float want = ids[t] < 0 ? 0.0f : tab_f[(size_t)ids[t] * H + i] * sc;
            bad += memcmp(&want, &x2[(size_t)t * H + i], 4) != 0 && !(want == 0 && x2[(size_t)t * H + i] == 0);
        }
    snprintf(name, sizeof name, "embedding_scaled %s H=%d T=%d (bits = float32 product, count)", dtn(dt), H, T);
    report_count(name, bad, (long)T * H);
    cudaFree(d_x), cudaFree(d_r), cudaFree(d_w), cudaFree(d_tab), cudaFree(d_ids);
    free(x), free(rf), free(w), free(r), free(x2), free(out), free(ref), free(tab_f), free(tab), free(ids);
}

/* ------------------------------------------------------------ RoPE + KV */

static void inv_freq_llama3(double *f, int D, double theta, bool llama3) {
    for (int i = 0; i < D / 2; i++) {
        double v = pow(theta, -(double)(2 * i) / D);
        if (llama3) { /* factor 8, low 1, high 4, original context 8192 */
            double lo = 1, hi = 4, factor = 8, octx = 8192;
            double wl = 2 * M_PI / v, lw = octx / lo, hw = octx / hi;
            double sc = wl > lw ? v / factor : v;
            if (!(wl < hw) && !(wl > lw)) {
                double sm = (octx / wl - lo) / (hi - lo);
                sc = (1 - sm) * sc / factor + sm * sc;
            }
            v = sc;
        }
        f[i] = v;
    }
}

/* kv E4M3: the caches hold codes, checked against the cpu encoder: V bit
 * for bit (its float32 value, x + bias, is known exactly), K within the
 * float32 rounding of the rotation (the code of some value within a few
 * ulps of the float64 rotation; INFO counts the ones equal to the code of
 * the float64 value rounded once). */
static void test_rope_kv(loom_cuda_dt dt, loom_cuda_kv kv, int H, int KVH, int D, int bs, int T,
                         bool bias, bool llama3) {
    const bool f8 = kv == LOOM_CUDA_KV_E4M3;
    const size_t kve = f8 ? 1 : 2;
    const int max_pos = 40000, half = D / 2, QKV = (H + 2 * KVH) * D, nblk = (T + bs - 1) / bs + 3;
    double *inv = malloc((size_t)half * 8);
    inv_freq_llama3(inv, D, llama3 ? 500000.0 : 10000.0, llama3);
    float *cs_d = NULL;
    double *d_inv = dev_upload(inv, (size_t)half * 8);
    CK(cudaMalloc((void **)&cs_d, (size_t)max_pos * half * 2 * 4));
    CK(loom_cuda_rope_table(cs_d, d_inv, max_pos, half, 0));
    float *qkv_f = malloc((size_t)T * QKV * 4), *b_f = malloc((size_t)QKV * 4);
    uint16_t *qkv = rand16(dt, (size_t)T * QKV, -1, 1, qkv_f);
    for (int i = 0; i < QKV; i++) b_f[i] = gpu_rng_unif(-0.5f, 0.5f);
    int32_t *pos = malloc((size_t)T * 4);
    int64_t *slot = malloc((size_t)T * 8);
    /* distinct slots in a shuffled order, some tokens skipped (-1) */
    int nslots = nblk * bs;
    int *perm = malloc((size_t)nslots * sizeof(int));
    for (int i = 0; i < nslots; i++) perm[i] = i;
    for (int i = nslots - 1; i > 0; i--) {
        int j = rng_int(i + 1), t = perm[i];
        perm[i] = perm[j], perm[j] = t;
    }
    for (int t = 0; t < T; t++) {
        pos[t] = rng_int(max_pos);
        slot[t] = (t % 5 == 3) ? -1 : perm[t];
    }
    const size_t cache_elems = (size_t)nblk * KVH * bs * D;
    void *d_qkv = dev_upload(qkv, (size_t)T * QKV * 2), *d_b = dev_upload(b_f, (size_t)QKV * 4);
    void *d_pos = dev_upload(pos, (size_t)T * 4), *d_slot = dev_upload(slot, (size_t)T * 8);
    void *d_k = dev_poison(cache_elems * kve), *d_v = dev_poison(cache_elems * kve);
    CK(loom_cuda_rope_kv(dt, kv, d_qkv, QKV, bias ? d_b : NULL, cs_d, d_pos, d_slot, d_k, d_v, T, H,
                         KVH, D, bs, 0));
    CK(cudaDeviceSynchronize());
    uint16_t *q2 = malloc((size_t)T * QKV * 2), *kc = malloc(cache_elems * 2),
             *vc = malloc(cache_elems * 2);
    const uint8_t *kc8 = (const uint8_t *)kc, *vc8 = (const uint8_t *)vc; /* f8: codes */
    CK(cudaMemcpy(q2, d_qkv, (size_t)T * QKV * 2, cudaMemcpyDeviceToHost));
    CK(cudaMemcpy(kc, d_k, cache_elems * kve, cudaMemcpyDeviceToHost));
    CK(cudaMemcpy(vc, d_v, cache_elems * kve, cudaMemcpyDeviceToHost));
    err_acc aq = {0}, ak = {0}, av = {0};
    long k_bad = 0, k_exact = 0, v_bad = 0, n_k = 0, n_v = 0;
    double *in = malloc((size_t)D * 8), *ref = malloc((size_t)D * 8), *out = malloc((size_t)D * 8);
    unsigned char *written = calloc(cache_elems / D, 1);
    for (int t = 0; t < T; t++) {
        for (int hh = 0; hh < H + 2 * KVH; hh++) {
            for (int i = 0; i < D; i++)
                in[i] = qkv_f[(size_t)t * QKV + hh * D + i] + (bias ? b_f[hh * D + i] : 0.0);
            if (hh < H + KVH)
                for (int i = 0; i < half; i++) {
                    double a = (double)pos[t] * inv[i];
                    /* the table stores float32 cos/sin: round like it */
                    double c = (float)cos(a), s = (float)sin(a);
                    ref[i] = in[i] * c - in[i + half] * s;
                    ref[i + half] = in[i + half] * c + in[i] * s;
                }
            else
                memcpy(ref, in, (size_t)D * 8);
            if (hh < H) {
                for (int i = 0; i < D; i++) out[i] = from16(dt, q2[(size_t)t * QKV + hh * D + i]);
                err_row(&aq, out, ref, D);
            } else if (slot[t] >= 0) {
                int kh = hh < H + KVH ? hh - H : hh - H - KVH;
                size_t row = ((size_t)(slot[t] / bs) * KVH + kh) * bs + slot[t] % bs;
                written[row] = 1;
                if (f8) {
                    /* the float32 inputs the kernel has: x + bias added in float */
                    float xf[128];
                    for (int i = 0; i < D; i++)
                        xf[i] = bias ? qkv_f[(size_t)t * QKV + hh * D + i] + b_f[hh * D + i]
                                     : qkv_f[(size_t)t * QKV + hh * D + i];
                    if (hh >= H + KVH) { /* V: bit for bit */
                        for (int i = 0; i < D; i++) v_bad += vc8[row * D + i] != e4m3_enc(xf[i]);
                        n_v += D;
                        continue;
                    }
                    for (int i = 0; i < D; i++) { /* K: the rotation in float32, any rounding */
                        const int j = i < half ? i : i - half;
                        const double a = (double)pos[t] * inv[j];
                        const double cn = (float)cos(a), sn = (float)sin(a);
                        const double x = xf[j], y = xf[j + half];
                        const double r = i < half ? x * cn - y * sn : y * cn + x * sn;
                        const double slack = 0x1p-21 * (fabs(x * cn) + fabs(y * sn)) + 1e-30;
                        const double lo = e4m3_dec(e4m3_enc((float)(r - slack)));
                        const double hi = e4m3_dec(e4m3_enc((float)(r + slack)));
                        const uint8_t got = kc8[row * D + i];
                        const double g = e4m3_dec(got);
                        k_bad += !(g >= lo && g <= hi);
                        k_exact += got == e4m3_enc((float)r);
                    }
                    n_k += D;
                    continue;
                }
                const uint16_t *c = hh < H + KVH ? kc : vc;
                for (int i = 0; i < D; i++) out[i] = from16(dt, c[row * D + i]);
                err_row(hh < H + KVH ? &ak : &av, out, ref, D);
            }
        }
    }
    /* rows of the cache no token maps to must still hold the poison */
    long clobbered = 0;
    for (size_t row = 0; row < cache_elems / D; row++)
        if (!written[row])
            for (int i = 0; i < D; i++)
                clobbered += f8 ? kc8[row * D + i] != 0xff || vc8[row * D + i] != 0xff
                                : kc[row * D + i] != 0xffff || vc[row * D + i] != 0xffff;
    char name[160];
    const char *kvs = f8 ? " e4m3-KV" : "";
    snprintf(name, sizeof name, "rope_kv %s%s H=%d KVH=%d D=%d T=%d%s%s (q)", dtn(dt), kvs, H, KVH, D,
             T, bias ? " bias" : "", llama3 ? " llama3" : "");
    report(name, &aq, TOL16);
    if (f8) {
        snprintf(name, sizeof name, "rope_kv %s e4m3-KV H=%d KVH=%d D=%d T=%d%s%s (k codes off, count)",
                 dtn(dt), H, KVH, D, T, bias ? " bias" : "", llama3 ? " llama3" : "");
        report_count(name, k_bad, n_k);
        snprintf(name, sizeof name, "rope_kv %s e4m3-KV H=%d KVH=%d D=%d T=%d%s%s (v codes = cpu, count)",
                 dtn(dt), H, KVH, D, T, bias ? " bias" : "", llama3 ? " llama3" : "");
        report_count(name, v_bad, n_v);
        printf("INFO rope_kv %s e4m3-KV D=%d: %ld of %ld K codes equal the code of the float64 rotation\n",
               dtn(dt), D, k_exact, n_k);
    } else {
        snprintf(name, sizeof name, "rope_kv %s H=%d KVH=%d D=%d T=%d%s%s (k cache)", dtn(dt), H, KVH,
                 D, T, bias ? " bias" : "", llama3 ? " llama3" : "");
        report(name, &ak, TOL16);
        snprintf(name, sizeof name, "rope_kv %s H=%d KVH=%d D=%d T=%d%s%s (v cache)", dtn(dt), H, KVH,
                 D, T, bias ? " bias" : "", llama3 ? " llama3" : "");
        report(name, &av, TOL16);
    }
    err_acc ac = {.worst = (double)clobbered, .rows = 1};
    snprintf(name, sizeof name, "rope_kv %s%s D=%d no stray cache writes (count)", dtn(dt), kvs, D);
    report(name, &ac, 0.0);
    cudaFree(d_inv), cudaFree(cs_d), cudaFree(d_qkv), cudaFree(d_b), cudaFree(d_pos);
    cudaFree(d_slot), cudaFree(d_k), cudaFree(d_v);
    free(inv), free(qkv_f), free(b_f), free(qkv), free(pos), free(slot), free(perm), free(q2);
    free(kc), free(vc), free(in), free(ref), free(out), free(written);
}

/* QK-norm + RoPE + KV write (loom_cuda_rope_kv_norm) against float64:
 * each q / k head (+ bias) normalised over D, times its weight, rotated
 * with the float32 table; v (+ bias) copied. Weights NULL for k when
 * !knorm (only q normalised). kv E4M3: the codes decoded against the same
 * reference at e4m3's precision (3 mantissa bits: < 2^-4 relative). */
static void test_rope_kv_norm(loom_cuda_dt dt, loom_cuda_kv kv, int H, int KVH, int D, int T, bool bias,
                              bool knorm) {
    const bool f8 = kv == LOOM_CUDA_KV_E4M3;
    const size_t kve = f8 ? 1 : 2;
    const int bs = 16, max_pos = 9000, half = D / 2, QKV = (H + 2 * KVH) * D, nblk = (T + bs - 1) / bs + 2;
    const float eps = 1e-6f;
    double *inv = malloc((size_t)half * 8);
    inv_freq_llama3(inv, D, 1000000.0, false);
    float *cs_d = NULL;
    double *d_inv = dev_upload(inv, (size_t)half * 8);
    CK(cudaMalloc((void **)&cs_d, (size_t)max_pos * half * 2 * 4));
    CK(loom_cuda_rope_table(cs_d, d_inv, max_pos, half, 0));
    float *qkv_f = malloc((size_t)T * QKV * 4), *b_f = malloc((size_t)QKV * 4), *w_f = malloc((size_t)2 * D * 4);
    uint16_t *qkv = rand16(dt, (size_t)T * QKV, -4, 4, qkv_f);
    for (int i = 0; i < QKV; i++) b_f[i] = gpu_rng_unif(-0.5f, 0.5f);
    for (int i = 0; i < 2 * D; i++) w_f[i] = gpu_rng_unif(0.2f, 2.0f);
    int32_t *pos = malloc((size_t)T * 4);
    int64_t *slot = malloc((size_t)T * 8);
    for (int t = 0; t < T; t++) pos[t] = rng_int(max_pos), slot[t] = t % 4 == 1 ? -1 : (int64_t)(nblk * bs - 1 - t);
    const size_t cache_elems = (size_t)nblk * KVH * bs * D;
    void *d_qkv = dev_upload(qkv, (size_t)T * QKV * 2), *d_b = dev_upload(b_f, (size_t)QKV * 4);
    float *d_w = dev_upload(w_f, (size_t)2 * D * 4);
    void *d_pos = dev_upload(pos, (size_t)T * 4), *d_slot = dev_upload(slot, (size_t)T * 8);
    void *d_k = dev_poison(cache_elems * kve), *d_v = dev_poison(cache_elems * kve);
    CK(loom_cuda_rope_kv_norm(dt, kv, d_qkv, QKV, bias ? d_b : NULL, d_w, knorm ? d_w + D : NULL, eps, cs_d, d_pos,
                              d_slot, d_k, d_v, T, H, KVH, D, bs, 0));
    CK(cudaDeviceSynchronize());
    uint16_t *q2 = malloc((size_t)T * QKV * 2);
    uint8_t *kc = malloc(cache_elems * kve), *vc = malloc(cache_elems * kve);
    CK(cudaMemcpy(q2, d_qkv, (size_t)T * QKV * 2, cudaMemcpyDeviceToHost));
    CK(cudaMemcpy(kc, d_k, cache_elems * kve, cudaMemcpyDeviceToHost));
    CK(cudaMemcpy(vc, d_v, cache_elems * kve, cudaMemcpyDeviceToHost));
    err_acc aq = {0}, ak = {0}, av = {0};
    double *in = malloc((size_t)D * 8), *ref = malloc((size_t)D * 8), *out = malloc((size_t)D * 8);
    long stray = 0;
    for (int t = 0; t < T; t++)
        for (int hh = 0; hh < H + 2 * KVH; hh++) {
            const bool is_q = hh < H, is_v = hh >= H + KVH;
            for (int i = 0; i < D; i++)
                in[i] = qkv_f[(size_t)t * QKV + hh * D + i] + (bias ? b_f[hh * D + i] : 0.0);
            const float *w = is_q ? w_f : knorm && !is_v ? w_f + D : NULL;
            if (w) {
                double ss = 0;
                for (int i = 0; i < D; i++) ss += in[i] * in[i];
                const double r = 1.0 / sqrt(ss / D + eps);
                for (int i = 0; i < D; i++) in[i] *= r * w[i];
            }
            if (!is_v)
                for (int i = 0; i < half; i++) {
                    const double a = (double)pos[t] * inv[i], c = (float)cos(a), s = (float)sin(a);
                    ref[i] = in[i] * c - in[i + half] * s;
                    ref[i + half] = in[i + half] * c + in[i] * s;
                }
            else
                memcpy(ref, in, (size_t)D * 8);
            if (is_q) {
                for (int i = 0; i < D; i++) out[i] = from16(dt, q2[(size_t)t * QKV + hh * D + i]);
                err_row(&aq, out, ref, D);
                continue;
            }
            const int kh = is_v ? hh - H - KVH : hh - H;
            const uint8_t *c = is_v ? vc : kc;
            if (slot[t] < 0) continue;
            const size_t row = ((size_t)(slot[t] / bs) * KVH + kh) * bs + slot[t] % bs;
            for (int i = 0; i < D; i++)
                out[i] = f8 ? e4m3_dec(c[row * D + i]) : from16(dt, ((const uint16_t *)c)[row * D + i]);
            err_row(is_v ? &av : &ak, out, ref, D);
        }
    /* the skipped tokens' slots (-1) were never written: their rows keep the poison */
    for (int t = 0; t < T; t++) {
        if (slot[t] >= 0) continue;
        const int64_t sl = nblk * bs - 1 - t;
        for (int kh = 0; kh < KVH; kh++) {
            const size_t row = ((size_t)(sl / bs) * KVH + kh) * bs + sl % bs;
            for (size_t i = 0; i < (size_t)D * kve; i++) stray += kc[row * D * kve + i] != 0xff || vc[row * D * kve + i] != 0xff;
        }
    }
    char name[200], cfg[120];
    snprintf(cfg, sizeof cfg, "%s%s H=%d KVH=%d D=%d T=%d%s%s", dtn(dt), f8 ? " e4m3-KV" : "", H, KVH, D, T,
             bias ? " bias" : "", knorm ? "" : " (k not normed)");
    const double tk = f8 ? 7e-2 : TOL16;
    snprintf(name, sizeof name, "rope_kv_norm %s (q)", cfg), report(name, &aq, TOL16);
    snprintf(name, sizeof name, "rope_kv_norm %s (k cache)", cfg), report(name, &ak, tk);
    snprintf(name, sizeof name, "rope_kv_norm %s (v cache)", cfg), report(name, &av, tk);
    snprintf(name, sizeof name, "rope_kv_norm %s no write for slot -1 (count)", cfg), report_count(name, stray, T);
    cudaFree(d_inv), cudaFree(cs_d), cudaFree(d_qkv), cudaFree(d_b), cudaFree(d_w), cudaFree(d_pos);
    cudaFree(d_slot), cudaFree(d_k), cudaFree(d_v);
    free(inv), free(qkv_f), free(b_f), free(w_f), free(qkv), free(pos), free(slot), free(q2), free(kc), free(vc);
    free(in), free(ref), free(out);
}

/* E4M3 write, bit for bit: every token at position 0 (cos 1, sin 0: the
 * rotation returns K's inputs unchanged, whatever the kernel's rounding),
 * no bias, so the kernel encodes exactly the dt values of the qkv rows.
 * K: nonzero finite values of every magnitude from e4m3 subnormals to past
 * the 448 saturation (random dt values: ties to even come up often, the
 * dt mantissa being longer than e4m3's); V: the same plus +-0, +-inf,
 * NaN of either sign, 448, 464, 480, exact ties. Codes must equal
 * loom_fp32_to_e4m3 of those values. */
static void test_rope_kv_e4m3_exact(loom_cuda_dt dt) {
    const int H = 2, KVH = 2, D = 64, bs = 16, T = 24, QKV = (H + 2 * KVH) * D, half = D / 2;
    const int nblk = (T + bs - 1) / bs;
    double *inv = malloc((size_t)half * 8);
    inv_freq_llama3(inv, D, 10000.0, false);
    float *cs_d = NULL;
    double *d_inv = dev_upload(inv, (size_t)half * 8);
    CK(cudaMalloc((void **)&cs_d, (size_t)4 * half * 2 * 4));
    CK(loom_cuda_rope_table(cs_d, d_inv, 4, half, 0));
    uint16_t *qkv = malloc((size_t)T * QKV * 2);
    float *qkv_f = malloc((size_t)T * QKV * 4);
    const float sp[] = {0.0f, -0.0f, INFINITY, -INFINITY, NAN, -NAN, 448.0f, -448.0f, 464.0f,
                        480.0f, -480.0f, 1e4f, 0x1p-10f, -0x1p-10f, 0x1.8p-9f, 0x1.8p-8f, 1.0625f,
                        1.1875f, -1.0625f, 0x1p-12f, 0x1.2p-7f, 0x1.1p-6f, 240.0f, 0x1.fp8f};
    const int nsp = (int)(sizeof sp / sizeof sp[0]);
    int k_sp = 0;
    for (int t = 0; t < T; t++)
        for (int c = 0; c < QKV; c++) {
            const bool is_v = c >= (H + KVH) * D;
            float f = (gpu_rng_next() & 1 ? -1.0f : 1.0f) * exp2f(gpu_rng_unif(-13.0f, 10.0f));
            if (is_v && rng_int(4) == 0) f = sp[k_sp++ % nsp];
            if (c < H * D) f = gpu_rng_unif(-1, 1); /* q: not checked here */
            qkv[(size_t)t * QKV + c] = to16(dt, f);
            qkv_f[(size_t)t * QKV + c] = from16(dt, qkv[(size_t)t * QKV + c]);
            if (!is_v && c >= H * D && qkv_f[(size_t)t * QKV + c] == 0.0f) /* K: never 0 */
                qkv[(size_t)t * QKV + c] = to16(dt, 1.0f), qkv_f[(size_t)t * QKV + c] = 1.0f;
        }
    int32_t *pos = calloc((size_t)T, 4);
    int64_t *slot = malloc((size_t)T * 8);
    for (int t = 0; t < T; t++) slot[t] = t;
    const size_t cache_elems = (size_t)nblk * KVH * bs * D;
    void *d_qkv = dev_upload(qkv, (size_t)T * QKV * 2), *d_pos = dev_upload(pos, (size_t)T * 4);
    void *d_slot = dev_upload(slot, (size_t)T * 8);
    void *d_k = dev_poison(cache_elems), *d_v = dev_poison(cache_elems);
    CK(loom_cuda_rope_kv(dt, LOOM_CUDA_KV_E4M3, d_qkv, QKV, NULL, cs_d, d_pos, d_slot, d_k, d_v, T,
                         H, KVH, D, bs, 0));
    CK(cudaDeviceSynchronize());
    uint8_t *kc = malloc(cache_elems), *vc = malloc(cache_elems);
    CK(cudaMemcpy(kc, d_k, cache_elems, cudaMemcpyDeviceToHost));
    CK(cudaMemcpy(vc, d_v, cache_elems, cudaMemcpyDeviceToHost));
    long kbad = 0, vbad = 0, n = 0, ties = 0, sat = 0, sub = 0;
    for (int t = 0; t < T; t++)
        for (int h = 0; h < KVH; h++)
            for (int i = 0; i < D; i++, n++) {
                const size_t at = (((size_t)(slot[t] / bs) * KVH + h) * bs + slot[t] % bs) * D + i;
                const float kx = qkv_f[(size_t)t * QKV + (H + h) * D + i];
                const float vx = qkv_f[(size_t)t * QKV + (H + KVH + h) * D + i];
                const uint8_t kw = e4m3_enc(kx);
                uint8_t vw = e4m3_enc(vx);
                /* f16 -> float32 on the device (cvt) need not keep a NaN's
                 * sign (upstream of the encoder, which does): f16 NaN, any */
                if (dt == LOOM_CUDA_F16 && isnan(vx) && (vc[at] & 0x7f) == 0x7f) vw = vc[at];
                kbad += kc[at] != kw;
                vbad += vc[at] != vw;
                if (kbad + vbad > 0 && kbad + vbad <= 5 && (kc[at] != kw || vc[at] != vw))
                    printf("  e4m3 write t=%d h=%d i=%d: k %a -> 0x%02x (cpu 0x%02x), v %a -> 0x%02x (cpu 0x%02x)\n",
                           t, h, i, (double)kx, kc[at], kw, (double)vx, vc[at], vw);
                /* what was covered: exact ties, saturation, subnormal codes */
                const double d = fabs(e4m3_dec(kw) - kx);
                ties += fabs(kx) < 448 && (kw & 0x7f) != 0x7f &&
                        d == fabs(e4m3_dec((uint8_t)(kw ^ 1)) - kx) && d > 0;
                sat += (kw & 0x7f) == 0x7e && fabs(kx) > 448;
                sub += (kw & 0x78) == 0 && (kw & 7) != 0;
            }
    char name[160];
    snprintf(name, sizeof name, "rope_kv %s e4m3 write = cpu encoder, K bit for bit (count)", dtn(dt));
    report_count(name, kbad, n);
    snprintf(name, sizeof name, "rope_kv %s e4m3 write = cpu encoder, V + specials (count)", dtn(dt));
    report_count(name, vbad, n);
    printf("INFO rope_kv %s e4m3 write: %ld K elements, %ld exact ties, %ld saturated, %ld subnormal codes\n",
           dtn(dt), n, ties, sat, sub);
    cudaFree(d_inv), cudaFree(cs_d), cudaFree(d_qkv), cudaFree(d_pos), cudaFree(d_slot);
    cudaFree(d_k), cudaFree(d_v);
    free(inv), free(qkv), free(qkv_f), free(pos), free(slot), free(kc), free(vc);
}

/* The attention kernels' E4M3 decoder (loom_cuda_e4m3_decode) on all 256
 * codes: the dt bits of the cpu's decoded value (exact in bf16 and f16),
 * subnormal codes included; the NaN codes read +-480 (e4m3.h). */
static void test_e4m3_decode(loom_cuda_dt dt) {
    const int n = 1024;
    uint8_t codes[1024];
    for (int i = 0; i < n; i++) codes[i] = i < 256 ? (uint8_t)i : (uint8_t)gpu_rng_next();
    void *d_c = dev_upload(codes, (size_t)n), *d_o = dev_poison((size_t)n * 2);
    CK(loom_cuda_e4m3_decode(dt, d_o, d_c, (size_t)n, 0));
    uint16_t out[1024];
    CK(cudaMemcpy(out, d_o, sizeof out, cudaMemcpyDeviceToHost));
    long bad = 0;
    for (int i = 0; i < n; i++) {
        const uint8_t c = codes[i];
        const float want = (c & 0x7f) == 0x7f ? (c & 0x80 ? -480.0f : 480.0f) : (float)e4m3_dec(c);
        const uint16_t wb = to16(dt, want);
        if (out[i] != wb) {
            if (bad < 5) printf("  e4m3 decode %s code 0x%02x: 0x%04x, want 0x%04x (%a)\n", dtn(dt), c, out[i], wb, (double)want);
            bad++;
        }
    }
    char name[96];
    snprintf(name, sizeof name, "e4m3 decode %s all 256 codes bit for bit (count)", dtn(dt));
    report_count(name, bad, n);
    cudaFree(d_c), cudaFree(d_o);
}

/* -------------------------------------------------------------- attention */

/* Element i of a cache built by rand_kv set to x (exact in dt and E4M3). */
static void kv_set(loom_cuda_dt dt, void *c, float *shadow, size_t i, float x) {
    if (g_kv == LOOM_CUDA_KV_E4M3) ((uint8_t *)c)[i] = e4m3_enc(x);
    else ((uint16_t *)c)[i] = to16(dt, x);
    shadow[i] = x;
}

/* g_sink's data over what test_attention drew (keys of every kv head). */
static void sink_data(loom_cuda_dt dt, int D, int KVH, int bs, int nseq, const int32_t *bt, int stride, size_t n,
                      void *kc, void *vc, float *kf, float *vf, uint16_t *q, float *qf, size_t nq) {
    for (size_t i = 0; i < n; i++) kv_set(dt, kc, kf, i, 0.0f), kv_set(dt, vc, vf, i, 1.0f);
    for (int s = 0; s < nseq; s++)
        for (int h = 0; h < KVH; h++)
            for (int i = 0; i < D; i++) {
                const size_t at = ((size_t)bt[(size_t)s * stride] * KVH + h) * bs * D + i; /* position 0 */
                kv_set(dt, kc, kf, at, 1.0f), kv_set(dt, vc, vf, at, 0.0f);
            }
    const uint16_t c = to16(dt, (float)(27.0 * log(2.0) / sqrt((double)D)) * ldexpf(1.0f, g_qexp));
    for (size_t i = 0; i < nq; i++) q[i] = c, qf[i] = (float)from16(dt, c);
}

/* One attention check. Sequences s have context ctx[s] and nq[s] query
 * tokens (the last ones). shape_mode: -1 the backend's policy (decode tile
 * when nq * G <= 16, else prefill tiles), 0 / 1 force decode (when it fits)
 * / prefill, 2 the batch-invariant call (loom_cuda_attention_invariant, one
 * token per tile). max_splits: 0 = backend-like choice, else this value —
 * in mode 2 the tiles one launch may take (its workspace), 0 = all. */
static void test_attention(const char *label, loom_cuda_dt dt, int D, int H, int KVH, int bs,
                           int nseq, const int *ctx, const int *nq, int shape_mode,
                           int max_splits_req) {
    const int G = H / KVH;
    const int ldq = (H + 2 * KVH) * D, ldo = H * D;
    int T = 0, nblk_used = 0, maxblk = 0;
    for (int s = 0; s < nseq; s++) {
        T += nq[s];
        int nb = (ctx[s] + bs - 1) / bs;
        nblk_used += nb;
        if (nb > maxblk) maxblk = nb;
    }
    const int nblk = nblk_used + 7;
    /* shuffled physical blocks */
    int *perm = malloc((size_t)nblk * sizeof(int));
    for (int i = 0; i < nblk; i++) perm[i] = i;
    for (int i = nblk - 1; i > 0; i--) {
        int j = rng_int(i + 1), t = perm[i];
        perm[i] = perm[j], perm[j] = t;
    }
    const int stride = maxblk + 2;
    int32_t *bt = malloc((size_t)nseq * stride * 4);
    for (int s = 0, k = 0; s < nseq; s++)
        for (int j = 0; j < stride; j++) {
            bt[(size_t)s * stride + j] = j < (ctx[s] + bs - 1) / bs ? perm[k++] : -1;
            /* with a window, blocks wholly before every query's window are
             * -1, as a windowed block-table group leaves them: never read */
            if ((j + 1) * bs <= win_lo(ctx[s] - nq[s])) bt[(size_t)s * stride + j] = -1;
        }
    const size_t cache_elems = (size_t)nblk * KVH * bs * D, kve = LOOM_CUDA_KV_ELT(g_kv);
    float *kf = malloc(cache_elems * 4), *vf = malloc(cache_elems * 4);
    void *kc = rand_kv(dt, cache_elems, kf), *vc = rand_kv(dt, cache_elems, vf);
    float *qf = malloc((size_t)T * ldq * 4);
    const float qr = ldexpf(1.0f, g_qexp);
    uint16_t *q = rand16(dt, (size_t)T * ldq, -qr, qr, qf);
    int32_t *pos = malloc((size_t)T * 4);
    int *seq_of = malloc((size_t)T * sizeof(int));
    for (int s = 0, t = 0; s < nseq; s++)
        for (int i = 0; i < nq[s]; i++, t++) pos[t] = ctx[s] - nq[s] + i, seq_of[t] = s;
    if (g_sink) sink_data(dt, D, KVH, bs, nseq, bt, stride, cache_elems, kc, vc, kf, vf, q, qf, (size_t)T * ldq);

    /* tiles, as the backend builds them (shape_mode 2, batch-invariant: one
     * token per tile, all in dtl, whatever shape the call picks) */
    const bool inv = shape_mode == 2;
    const int drows = loom_cuda_attn_rows(LOOM_CUDA_ATTN_DECODE);
    const int tpt = loom_cuda_attn_rows(LOOM_CUDA_ATTN_PREFILL) / G;
    loom_cuda_attn_tile *dtl = malloc(sizeof *dtl * (size_t)(T + 1));
    loom_cuda_attn_tile *ptl = malloc(sizeof *ptl * (size_t)(T + 1));
    int nd = 0, np = 0;
    for (int s = 0, t0 = 0; s < nseq; t0 += nq[s], s++) {
        bool dec = shape_mode == 0 ? nq[s] * G <= drows
                                   : shape_mode == 1 ? false : nq[s] * G <= drows;
        if (inv)
            for (int k = 0; k < nq[s]; k++) dtl[nd++] = (loom_cuda_attn_tile){s, t0 + k, 1, 0};
        else if (dec) dtl[nd++] = (loom_cuda_attn_tile){s, t0, nq[s], 0};
        else
            for (int k = 0; k < nq[s]; k += tpt)
                ptl[np++] = (loom_cuda_attn_tile){s, t0 + k, nq[s] - k < tpt ? nq[s] - k : tpt, 0};
    }
    int sms = 132;
    cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0);
    int ms[2];
    int ntl[2] = {nd, np};
    size_t ws = 0;
    /* invariant: workspace for max_splits_req tiles a launch (several
     * launches when fewer than T), or all of them */
    const size_t inv_tile = loom_cuda_attn_invariant_ws_floats(H, KVH, D);
    const int inv_per_launch = max_splits_req > 0 && max_splits_req < T ? max_splits_req : T;
    for (int k = 0; inv && k < 2; k++) ms[k] = LOOM_CUDA_ATTN_INVARIANT_SPLITS;
    if (inv) ws = inv_tile * (size_t)inv_per_launch;
    for (int k = 0; !inv && k < 2; k++) {
        if (max_splits_req > 0) ms[k] = max_splits_req;
        else /* the backend's policy: one wave of resident CTAs */
            ms[k] = loom_cuda_attn_max_splits(
                ntl[k], KVH, sms * loom_cuda_attn_ctas_per_sm(dt, g_kv, (loom_cuda_attn_shape)k, D));
        size_t w = loom_cuda_attn_workspace_floats(k ? LOOM_CUDA_ATTN_PREFILL : LOOM_CUDA_ATTN_DECODE,
                                                   ntl[k], KVH, D, ms[k]);
        if (w > ws) ws = w;
    }
    void *d_k = dev_upload(kc, cache_elems * kve), *d_v = dev_upload(vc, cache_elems * kve);
    void *d_q = dev_upload(q, (size_t)T * ldq * 2), *d_pos = dev_upload(pos, (size_t)T * 4);
    void *d_bt = dev_upload(bt, (size_t)nseq * stride * 4);
    int32_t stride_h = stride;
    void *d_stride = dev_upload(&stride_h, 4);
    void *d_dt = dev_upload(dtl, sizeof *dtl * (size_t)(nd ? nd : 1));
    void *d_pt = dev_upload(ptl, sizeof *ptl * (size_t)(np ? np : 1));
    void *d_out = dev_poison((size_t)T * ldo * 2);
    float *d_ws = dev_poison(ws * 4 + 16);
    int *d_sem = NULL;
    CK(cudaMalloc((void **)&d_sem, (size_t)(T + 1) * KVH * sizeof(int)));
    CK(cudaMemset(d_sem, 0, (size_t)(T + 1) * KVH * sizeof(int)));
    loom_cuda_attn_args a = {.dt = dt, .kv = g_kv, .out = d_out, .ldo = ldo, .q = d_q, .ldq = ldq,
                             .k_cache = d_k, .v_cache = d_v, .block_table = d_bt,
                             .bt_stride = d_stride, .positions = d_pos, .num_heads = H,
                             .num_kv_heads = KVH, .head_dim = D, .block_size = bs,
                             .scale = (float)(1.0 / sqrt((double)D) / qr), .partial = d_ws,
                             .sem = d_sem, .window = g_window};
    cudaEvent_t e0, e1;
    CK(cudaEventCreate(&e0));
    CK(cudaEventCreate(&e1));
    for (int rep = 0; rep < 2; rep++) { /* twice: the counters must work on reuse */
    if (rep == 1) CK(cudaMemset(d_out, 0xff, (size_t)T * ldo * 2));
    CK(cudaEventRecord(e0, 0));
    if (inv) {
        a.tiles = d_dt, a.num_tiles = nd;
        CK(loom_cuda_attention_invariant(&a, ws, 0));
    } else if (nd) {
        a.shape = LOOM_CUDA_ATTN_DECODE, a.tiles = d_dt, a.num_tiles = nd, a.max_splits = ms[0];
        CK(loom_cuda_attention(&a, 0));
    }
    if (np) {
        a.shape = LOOM_CUDA_ATTN_PREFILL, a.tiles = d_pt, a.num_tiles = np, a.max_splits = ms[1];
        CK(loom_cuda_attention(&a, 0));
    }
    CK(cudaEventRecord(e1, 0));
    CK(cudaDeviceSynchronize());
    }
    float ms_time = 0;
    cudaEventElapsedTime(&ms_time, e0, e1);
    uint16_t *o_h = malloc((size_t)T * ldo * 2);
    CK(cudaMemcpy(o_h, d_out, (size_t)T * ldo * 2, cudaMemcpyDeviceToHost));

    /* float64 reference, every (token, head) row (rows spread over OpenMP
     * threads; per-row errors merged afterwards) */
    err_acc acc = {0};
    int maxctx = 0;
    for (int s = 0; s < nseq; s++) maxctx = ctx[s] > maxctx ? ctx[s] : maxctx;
    double *row_err = malloc((size_t)T * H * sizeof(double));
    unsigned char *row_nan = calloc((size_t)T * H, 1);
    const double scale = (double)a.scale;
#pragma omp parallel
    {
        double *sc = malloc((size_t)maxctx * 8), *ref = malloc((size_t)D * 8);
#pragma omp for schedule(dynamic, 1)
        for (int th = 0; th < T * H; th++) {
            const int t = th / H, h = th % H;
            const int s = seq_of[t], p = pos[t], kvh = h / G;
            const float *qr = qf + (size_t)t * ldq + (size_t)h * D;
            double m = -INFINITY;
            const int j0 = win_lo(p);
            for (int j = j0; j <= p; j++) {
                size_t row = ((size_t)bt[(size_t)s * stride + j / bs] * KVH + kvh) * bs + j % bs;
                const float *kr = kf + row * D;
                double d = 0;
                for (int i = 0; i < D; i++) d += (double)qr[i] * kr[i];
                sc[j] = d * scale;
                if (sc[j] > m) m = sc[j];
            }
            double l = 0;
            for (int i = 0; i < D; i++) ref[i] = 0;
            for (int j = j0; j <= p; j++) {
                double w = exp(sc[j] - m);
                l += w;
                size_t row = ((size_t)bt[(size_t)s * stride + j / bs] * KVH + kvh) * bs + j % bs;
                const float *vr = vf + row * D;
                for (int i = 0; i < D; i++) ref[i] += w * vr[i];
            }
            double dd = 0, rr = 0;
            for (int i = 0; i < D; i++) {
                double r = ref[i] / l, o = from16(dt, o_h[(size_t)t * ldo + (size_t)h * D + i]);
                if (isnan(o) || isinf(o)) row_nan[th] = 1;
                dd += (o - r) * (o - r);
                rr += r * r;
            }
            row_err[th] = sqrt(dd) / (sqrt(rr) > 1e-30 ? sqrt(rr) : 1e-30);
        }
        free(sc), free(ref);
    }
    for (int th = 0; th < T * H; th++) {
        if (row_nan[th]) acc.nan = true;
        if (!(row_err[th] <= acc.worst)) acc.worst = row_err[th];
        acc.rows++;
    }
    char name[200];
    char wn[48] = "";
    if (g_window > 0) snprintf(wn, sizeof wn, " window %d", g_window);
    if (g_sink) snprintf(wn + strlen(wn), sizeof wn - strlen(wn), " sink");
    if (g_qexp) snprintf(wn + strlen(wn), sizeof wn - strlen(wn), " q*2^%d", g_qexp);
    if (inv)
        snprintf(name, sizeof name, "attention %s %s%s%s D=%d H=%d/%d bs=%d T=%d invariant %d tiles/launch (%.2f ms)",
                 label, dtn(dt), kvn(), wn, D, H, KVH, bs, T, inv_per_launch, ms_time);
    else
        snprintf(name, sizeof name, "attention %s %s%s%s D=%d H=%d/%d bs=%d T=%d tiles %d+%d splits %d/%d (%.2f ms)",
                 label, dtn(dt), kvn(), wn, D, H, KVH, bs, T, nd, np, ms[0], ms[1], ms_time);
    report(name, &acc, TOL16);
    cudaEventDestroy(e0), cudaEventDestroy(e1);
    cudaFree(d_k), cudaFree(d_v), cudaFree(d_q), cudaFree(d_pos), cudaFree(d_bt);
    /* the kernel must leave its split-K counters at zero */
    int *sem_h = malloc((size_t)(T + 1) * KVH * sizeof(int));
    CK(cudaMemcpy(sem_h, d_sem, (size_t)(T + 1) * KVH * sizeof(int), cudaMemcpyDeviceToHost));
    long nonzero = 0;
    for (int i = 0; i < (T + 1) * KVH; i++) nonzero += sem_h[i] != 0;
    if (nonzero) {
        err_acc bad = {.worst = (double)nonzero, .rows = 1};
        report("  ... split-K counters left non-zero (count)", &bad, 0.0);
    }
    free(sem_h);
    cudaFree(d_sem);
    cudaFree(d_stride), cudaFree(d_dt), cudaFree(d_pt), cudaFree(d_out), cudaFree(d_ws);
    free(perm), free(bt), free(kf), free(vf), free(kc), free(vc), free(qf), free(q), free(pos);
    free(seq_of), free(dtl), free(ptl), free(o_h), free(row_err), free(row_nan);
}

/* ------------------------------------------------- batch invariance */

/* Elements of n 16-bit or 32-bit values whose bits differ. */
static long bits_differ(const void *a, const void *b, size_t n, size_t el) {
    long d = 0;
    for (size_t i = 0; i < n; i++) d += memcmp((const char *)a + i * el, (const char *)b + i * el, el) != 0;
    return d;
}

/* NaN elements among n values of `el` bytes (2: dt, 4: float32): what a
 * poisoned output keeps where nothing was written. */
static long count_nan(loom_cuda_dt dt, const void *v, size_t n, size_t el) {
    long c = 0;
    for (size_t i = 0; i < n; i++)
        c += el == 4 ? isnan(((const float *)v)[i]) : isnan(from16(dt, ((const uint16_t *)v)[i]));
    return c;
}

/* Report a bitwise comparison: PASS when nothing differs (err = count). */
static void report_bits(const char *name, long differ, long checked) {
    err_acc a = {.worst = (double)differ, .rows = checked};
    report(name, &a, 0.0);
}

/* loom_cuda_attention_invariant: every (token, head) output of one step —
 * sequence 0 brings nv tokens ending at context ctx0 (a draft
 * verification), two more sequences bring 1 and 3 (another decode and
 * another verification), and two dummy tokens repeat sequence 0's last one
 * (CUDA-graph padding) — must have exactly the bits that token gets when it
 * is the only one in the launch (a decode step). Checked with the
 * workspace for every tile and for 3 tiles a launch. The ordinary dispatch
 * (one decode or prefill tile for sequence 0's tokens, split bound by the
 * backend's policy) is reported as INFO: it is expected to differ. */
static void test_attention_invariance(loom_cuda_dt dt, int D, int H, int KVH, int bs, int ctx0, int nv) {
    const int G = H / KVH, nseq = 3;
    const int ctx[3] = {ctx0, 37, 300}, nq[3] = {nv, 1, 3}, ndummy = 2;
    const int ldq = (H + 2 * KVH) * D, ldo = H * D;
    int T = ndummy, maxblk = 0, nblk = 1;
    for (int s = 0; s < nseq; s++) {
        const int nb = (ctx[s] + bs - 1) / bs;
        T += nq[s], nblk += nb, maxblk = nb > maxblk ? nb : maxblk;
    }
    const int stride = maxblk;
    int32_t *bt = malloc((size_t)nseq * stride * 4);
    for (int s = 0, k = 1; s < nseq; s++) /* consecutive blocks, block 0 unused */
        for (int j = 0; j < stride; j++) bt[(size_t)s * stride + j] = j < (ctx[s] + bs - 1) / bs ? k++ : 0;
    const size_t cache_elems = (size_t)nblk * KVH * bs * D, kve = LOOM_CUDA_KV_ELT(g_kv);
    void *kc = rand_kv(dt, cache_elems, NULL), *vc = rand_kv(dt, cache_elems, NULL);
    uint16_t *q = rand16(dt, (size_t)T * ldq, -1, 1, NULL);
    int32_t *pos = malloc((size_t)T * 4);
    loom_cuda_attn_tile *tl = malloc(sizeof *tl * (size_t)T);
    int t = 0;
    for (int s = 0; s < nseq; s++)
        for (int i = 0; i < nq[s]; i++, t++) {
            pos[t] = ctx[s] - nq[s] + i;
            tl[t] = (loom_cuda_attn_tile){s, t, 1, 0};
        }
    for (int i = 0; i < ndummy; i++, t++) { /* graph padding: sequence 0's last token again */
        memcpy(q + (size_t)t * ldq, q + (size_t)(nv - 1) * ldq, (size_t)ldq * 2);
        pos[t] = pos[nv - 1];
        tl[t] = (loom_cuda_attn_tile){0, t, 1, 0};
    }
    const size_t per_tile = loom_cuda_attn_invariant_ws_floats(H, KVH, D);
    size_t ws_all = per_tile * (size_t)T;
    const size_t ws_ord = loom_cuda_attn_workspace_floats(LOOM_CUDA_ATTN_PREFILL, T, KVH, D, 64) +
                          loom_cuda_attn_workspace_floats(LOOM_CUDA_ATTN_DECODE, T, KVH, D, 64);
    void *d_k = dev_upload(kc, cache_elems * kve), *d_v = dev_upload(vc, cache_elems * kve);
    void *d_q = dev_upload(q, (size_t)T * ldq * 2), *d_pos = dev_upload(pos, (size_t)T * 4);
    void *d_bt = dev_upload(bt, (size_t)nseq * stride * 4);
    int32_t stride_h = stride;
    void *d_stride = dev_upload(&stride_h, 4);
    loom_cuda_attn_tile *d_tl = dev_upload(tl, sizeof *tl * (size_t)T);
    float *d_ws = dev_poison((ws_all > ws_ord ? ws_all : ws_ord) * 4 + 16);
    int *d_sem = NULL;
    CK(cudaMalloc((void **)&d_sem, (size_t)T * KVH * sizeof(int)));
    CK(cudaMemset(d_sem, 0, (size_t)T * KVH * sizeof(int)));
    const size_t out_bytes = (size_t)T * ldo * 2;
    void *d_out = dev_poison(out_bytes);
    loom_cuda_attn_args a = {.dt = dt, .kv = g_kv, .out = d_out, .ldo = ldo, .q = d_q, .ldq = ldq,
                             .k_cache = d_k, .v_cache = d_v, .block_table = d_bt,
                             .bt_stride = d_stride, .positions = d_pos, .num_heads = H,
                             .num_kv_heads = KVH, .head_dim = D, .block_size = bs,
                             .scale = (float)(1.0 / sqrt((double)D)), .partial = d_ws,
                             .sem = d_sem, .window = g_window};
    uint16_t *alone = malloc(out_bytes), *all = malloc(out_bytes), *chunked = malloc(out_bytes);
    /* each token alone: a launch of its one tile */
    for (int i = 0; i < T; i++) {
        a.tiles = d_tl + i, a.num_tiles = 1;
        CK(loom_cuda_attention_invariant(&a, ws_all, 0));
    }
    CK(cudaMemcpy(alone, d_out, out_bytes, cudaMemcpyDeviceToHost));
    const size_t ws_try[2] = {ws_all, per_tile * 3};
    uint16_t *dst[2] = {all, chunked};
    for (int k = 0; k < 2; k++) { /* the whole step at once, then 3 tiles a launch */
        CK(cudaMemset(d_out, 0xff, out_bytes));
        a.tiles = d_tl, a.num_tiles = T;
        CK(loom_cuda_attention_invariant(&a, ws_try[k], 0));
        CK(cudaMemcpy(dst[k], d_out, out_bytes, cudaMemcpyDeviceToHost));
    }
    CK(cudaDeviceSynchronize());
    const size_t n = (size_t)T * ldo;
    const long nan = count_nan(dt, alone, n, 2);
    char name[200];
    snprintf(name, sizeof name, "attention invariant %s%s D=%d H=%d/%d bs=%d ctx %d, %d-token verify: alone = in step",
             dtn(dt), kvn(), D, H, KVH, bs, ctx0, nv);
    report_bits(name, bits_differ(alone, all, n, 2) + nan, T);
    snprintf(name, sizeof name, "attention invariant %s%s D=%d H=%d/%d bs=%d ctx %d, %d-token verify: alone = 3 tiles/launch",
             dtn(dt), kvn(), D, H, KVH, bs, ctx0, nv);
    report_bits(name, bits_differ(alone, chunked, n, 2), T);
    /* the padding tokens equal the token they repeat */
    snprintf(name, sizeof name, "attention invariant %s%s D=%d H=%d/%d ctx %d: padding token = its original",
             dtn(dt), kvn(), D, H, KVH, ctx0);
    report_bits(name, bits_differ(all + (size_t)(T - 1) * ldo, all + (size_t)(nv - 1) * ldo, (size_t)ldo, 2), 1);

    /* INFO: the ordinary dispatch, sequence 0's tokens as one step vs alone */
    {
        const int drows = loom_cuda_attn_rows(LOOM_CUDA_ATTN_DECODE);
        const loom_cuda_attn_shape sh = nv * G <= drows ? LOOM_CUDA_ATTN_DECODE : LOOM_CUDA_ATTN_PREFILL;
        const int tpt = loom_cuda_attn_rows(sh) / G;
        int sms = 132;
        cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0);
        const int resident = sms * loom_cuda_attn_ctas_per_sm(dt, g_kv, sh, D);
        const int resident_dec = sms * loom_cuda_attn_ctas_per_sm(dt, g_kv, LOOM_CUDA_ATTN_DECODE, D);
        loom_cuda_attn_tile group[64];
        int ng = 0;
        for (int k = 0; k < nv && ng < 64; k += tpt)
            group[ng++] = (loom_cuda_attn_tile){0, k, nv - k < tpt ? nv - k : tpt, 0};
        loom_cuda_attn_tile *d_g = dev_upload(group, sizeof group[0] * (size_t)ng);
        uint16_t *ord_alone = malloc(out_bytes), *ord_step = malloc(out_bytes);
        a.shape = LOOM_CUDA_ATTN_DECODE;
        if (G <= drows) {
            for (int i = 0; i < nv; i++) {
                a.tiles = d_tl + i, a.num_tiles = 1;
                a.max_splits = loom_cuda_attn_max_splits(1, KVH, resident_dec);
                CK(loom_cuda_attention(&a, 0));
            }
            CK(cudaMemcpy(ord_alone, d_out, out_bytes, cudaMemcpyDeviceToHost));
            a.shape = sh, a.tiles = d_g, a.num_tiles = ng;
            a.max_splits = loom_cuda_attn_max_splits(ng, KVH, resident);
            CK(loom_cuda_attention(&a, 0));
            CK(cudaMemcpy(ord_step, d_out, out_bytes, cudaMemcpyDeviceToHost));
            CK(cudaDeviceSynchronize());
            printf("INFO attention ordinary dispatch %s%s D=%d H=%d/%d ctx %d: %ld of %zu outputs of the %d-token step differ from decode\n",
                   dtn(dt), kvn(), D, H, KVH, ctx0, bits_differ(ord_alone, ord_step, (size_t)nv * ldo, 2),
                   (size_t)nv * ldo, nv);
        }
        cudaFree(d_g);
        free(ord_alone), free(ord_step);
    }
    cudaFree(d_k), cudaFree(d_v), cudaFree(d_q), cudaFree(d_pos), cudaFree(d_bt), cudaFree(d_stride);
    cudaFree(d_tl), cudaFree(d_ws), cudaFree(d_sem), cudaFree(d_out);
    free(bt), free(kc), free(vc), free(q), free(pos), free(tl), free(alone), free(all), free(chunked);
}

/* ------------------------------------------------------------ KV copies */

static void test_copy_blocks(bool to_host) {
    const int npools = 6, nblk = 40;
    const size_t bb = 8 * 16 * 64 * 2; /* KVH 8, bs 16, D 64, bf16 */
    uint8_t *src_h = malloc(npools * nblk * bb);
    for (size_t i = 0; i < npools * nblk * bb; i++) src_h[i] = (uint8_t)gpu_rng_next();
    void *src_ptrs[6], *dst_ptrs[6];
    void *dst_host = NULL;
    for (int p = 0; p < npools; p++) src_ptrs[p] = dev_upload(src_h + p * nblk * bb, nblk * bb);
    if (to_host) {
        CK(cudaHostAlloc(&dst_host, npools * nblk * bb, cudaHostAllocMapped));
        memset(dst_host, 0xab, npools * nblk * bb);
        for (int p = 0; p < npools; p++)
            CK(cudaHostGetDevicePointer(&dst_ptrs[p], (uint8_t *)dst_host + p * nblk * bb, 0));
    } else {
        for (int p = 0; p < npools; p++) {
            dst_ptrs[p] = dev_poison(nblk * bb);
            CK(cudaMemset(dst_ptrs[p], 0xab, nblk * bb));
        }
    }
    int32_t pairs[2 * 9];
    for (int i = 0; i < 9; i++) pairs[2 * i] = (i * 7 + 1) % nblk, pairs[2 * i + 1] = (i * 11 + 5) % nblk;
    void *d_src = dev_upload(src_ptrs, sizeof src_ptrs), *d_dst = dev_upload(dst_ptrs, sizeof dst_ptrs);
    void *d_pairs = dev_upload(pairs, sizeof pairs);
    CK(loom_cuda_copy_blocks(d_src, d_dst, npools, d_pairs, 9, bb, 0));
    CK(cudaDeviceSynchronize());
    long bad = 0;
    uint8_t *got = malloc(nblk * bb);
    for (int p = 0; p < npools; p++) {
        if (to_host) memcpy(got, (uint8_t *)dst_host + p * nblk * bb, nblk * bb);
        else CK(cudaMemcpy(got, dst_ptrs[p], nblk * bb, cudaMemcpyDeviceToHost));
        for (int b = 0; b < nblk; b++) {
            int from = -1;
            for (int i = 0; i < 9; i++)
                if (pairs[2 * i + 1] == b) from = pairs[2 * i];
            for (size_t k = 0; k < bb; k++) {
                uint8_t want = from >= 0 ? src_h[(p * nblk + from) * bb + k] : 0xab;
                if (got[b * bb + k] != want) bad++;
            }
        }
    }
    err_acc a = {.worst = (double)bad, .rows = 1};
    report(to_host ? "copy_blocks device -> mapped host (wrong bytes)"
                   : "copy_blocks device -> device (wrong bytes)", &a, 0.0);
    for (int p = 0; p < npools; p++) {
        cudaFree(src_ptrs[p]);
        if (!to_host) cudaFree(dst_ptrs[p]);
    }
    if (dst_host) cudaFreeHost(dst_host);
    cudaFree(d_src), cudaFree(d_dst), cudaFree(d_pairs);
    free(src_h), free(got);
}

/* ------------------------------------------------------------ launch order */

/* Every translation unit's copy of the flag starts off, as the memo in
 * launch_order.c assumes, and loom_cuda_set_trigger_first reaches each copy
 * (read back: the kernels' results are the same either way). Runs before
 * anything sets the order. */
static void test_launch_order(void) {
    int units = 0, on = 0;
    CK(loom_cuda_trigger_first_units(&units, &on));
    const bool loaded_off = units >= 8 && on == 0;
    printf("%s launch order as loaded: %d of %d units on\n", loaded_off ? "PASS" : "FAIL", on, units);
    if (loaded_off) g_pass++;
    else g_fail++;
    for (int k = 1; k >= 0; k--) { /* ends at the default, off */
        CK(loom_cuda_set_trigger_first(k));
        CK(loom_cuda_trigger_first_units(&units, &on));
        const bool ok = units >= 8 && on == (k ? units : 0);
        printf("%s launch order %s: %d of %d units on\n", ok ? "PASS" : "FAIL", k ? "on" : "off", on, units);
        if (ok) g_pass++;
        else g_fail++;
    }
}

/* ------------------------------------------------------------------ GEMM */

static void test_gemm(loom_cuda_gemm *g, loom_cuda_dt dt, int M, int N, int K, bool out_f32) {
    float *xf = malloc((size_t)M * K * 4), *wf = malloc((size_t)N * K * 4);
    uint16_t *x = rand16(dt, (size_t)M * K, -1, 1, xf), *w = rand16(dt, (size_t)N * K, -1, 1, wf);
    void *d_x = dev_upload(x, (size_t)M * K * 2), *d_w = dev_upload(w, (size_t)N * K * 2);
    const size_t oel = out_f32 ? 4 : 2;
    void *d_y = dev_poison((size_t)M * N * oel);
    char msg[256] = "";
    int rc = loom_cuda_gemm_run(g, dt, out_f32, M, N, K, d_x, d_w, d_y, 0, msg, sizeof msg);
    CK(cudaDeviceSynchronize());
    err_acc a = {0};
    char name[128];
    snprintf(name, sizeof name, "gemm %s M=%d N=%d K=%d -> %s", dtn(dt), M, N, K,
             out_f32 ? "f32" : dtn(dt));
    if (rc) {
        printf("      gemm error: %s\n", msg);
        a.nan = true;
        report(name, &a, TOL16);
        goto done;
    }
    void *y = malloc((size_t)M * N * oel);
    CK(cudaMemcpy(y, d_y, (size_t)M * N * oel, cudaMemcpyDeviceToHost));
    double *out = malloc((size_t)N * 8), *ref = malloc((size_t)N * 8);
    for (int m = 0; m < M; m++) {
        for (int n = 0; n < N; n++) {
            double s = 0;
            const float *xr = xf + (size_t)m * K, *wr = wf + (size_t)n * K;
            for (int k = 0; k < K; k++) s += (double)xr[k] * wr[k];
            ref[n] = s;
            out[n] = out_f32 ? ((float *)y)[(size_t)m * N + n] : from16(dt, ((uint16_t *)y)[(size_t)m * N + n]);
        }
        err_row(&a, out, ref, N);
    }
    report(name, &a, out_f32 ? 1e-4 : TOL16);
    free(y), free(out), free(ref);
done:
    cudaFree(d_x), cudaFree(d_w), cudaFree(d_y);
    free(xf), free(wf), free(x), free(w);
}

/* Batch-invariant linear layer (loom_cuda_gemm_set_batch_invariant): the
 * rows of y computed at M = 1 (one call per row), 5, 8, 13 and Mmax (the
 * first M rows of one x) must agree bit for bit. The ordinary path at
 * M = 13 (cuBLASLt) vs M = 1 (GEMV) is reported as INFO. */
static void test_gemm_invariance(loom_cuda_gemm *g, loom_cuda_dt dt, int N, int K, bool out_f32, int Mmax) {
    uint16_t *x = rand16(dt, (size_t)Mmax * K, -1, 1, NULL), *w = rand16(dt, (size_t)N * K, -1, 1, NULL);
    void *d_x = dev_upload(x, (size_t)Mmax * K * 2), *d_w = dev_upload(w, (size_t)N * K * 2);
    const size_t oel = out_f32 ? 4 : 2, row = (size_t)N * oel;
    void *d_y = dev_poison((size_t)Mmax * row);
    char *one = malloc((size_t)Mmax * row), *many = malloc((size_t)Mmax * row), msg[256] = "", name[160];
    int rc = 0;
    loom_cuda_gemm_set_batch_invariant(g, 1);
    for (int m = 0; m < Mmax && !rc; m++)
        rc = loom_cuda_gemm_run(g, dt, out_f32, 1, N, K, (const char *)d_x + (size_t)m * K * 2, d_w,
                                (char *)d_y + (size_t)m * row, 0, msg, sizeof msg);
    CK(cudaDeviceSynchronize());
    CK(cudaMemcpy(one, d_y, (size_t)Mmax * row, cudaMemcpyDeviceToHost));
    const long unwritten = count_nan(dt, one, (size_t)Mmax * N, oel);
    const int Ms[4] = {5, 8, 13, Mmax};
    for (int i = 0; i < 4; i++) {
        const int M = Ms[i] < Mmax ? Ms[i] : Mmax;
        CK(cudaMemset(d_y, 0xff, (size_t)Mmax * row));
        if (!rc) rc = loom_cuda_gemm_run(g, dt, out_f32, M, N, K, d_x, d_w, d_y, 0, msg, sizeof msg);
        CK(cudaDeviceSynchronize());
        CK(cudaMemcpy(many, d_y, (size_t)M * row, cudaMemcpyDeviceToHost));
        snprintf(name, sizeof name, "gemm invariant %s N=%d K=%d -> %s: M=%d rows = M=1 rows", dtn(dt), N, K,
                 out_f32 ? "f32" : dtn(dt), M);
        if (rc) printf("      gemm error: %s\n", msg);
        report_bits(name, rc ? 1 : bits_differ(one, many, (size_t)M * N, oel) + unwritten, M);
    }
    loom_cuda_gemm_set_batch_invariant(g, 0);
    if (!rc && Mmax >= 13) {
        rc = loom_cuda_gemm_run(g, dt, out_f32, 13, N, K, d_x, d_w, d_y, 0, msg, sizeof msg);
        CK(cudaDeviceSynchronize());
        CK(cudaMemcpy(many, d_y, 13 * row, cudaMemcpyDeviceToHost));
        if (!rc)
            printf("INFO gemm ordinary path %s N=%d K=%d: %ld of %d outputs at M=13 (cuBLASLt) differ from M=1 (GEMV)\n",
                   dtn(dt), N, K, bits_differ(one, many, (size_t)13 * N, oel), 13 * N);
    }
    cudaFree(d_x), cudaFree(d_w), cudaFree(d_y);
    free(x), free(w), free(one), free(many);
}

/* ------------------------------------------------------ quantized GEMM */

/* E4M3 ("fn") codec: the CPU kernels' (kernels/cpu/qlinear.c, tested
 * against a float64 reference in tests/quant), so the device's codes are
 * checked against the host's. */
static const char *qfmt_name(loom_cuda_qfmt f) {
    switch (f) {
    case LOOM_CUDA_Q_INT8_W8A16: return "int8_w8a16";
    case LOOM_CUDA_Q_INT8_W8A8: return "int8_w8a8";
    case LOOM_CUDA_Q_FP8: return "fp8";
    case LOOM_CUDA_Q_INT4: return "int4";
    default: return "?";
    }
}

/* Default GEMV bounds of loom_cuda_gemm_create (restored after each test). */
static void qgemm_defaults(loom_cuda_gemm *g) {
    loom_cuda_qgemm_set_gemv_max_m(g, LOOM_CUDA_Q_INT8_W8A16, 16);
    loom_cuda_qgemm_set_gemv_max_m(g, LOOM_CUDA_Q_INT8_W8A8, 8);
    loom_cuda_qgemm_set_gemv_max_m(g, LOOM_CUDA_Q_FP8, 8);
    loom_cuda_qgemm_set_gemv_max_m(g, LOOM_CUDA_Q_INT4, 32);
}

/* test_qgemm's activations: the [-2, 2] of every test, or (set) tokens of
 * very different magnitudes — what the tensor-core paths' per-token
 * power-of-two f16 scaling is for. At M = 1 the one token is of kind 1
 * (beyond f16's range), or of kind 2 (tiny) / 3 (powers of two) / 4 (all
 * positive, 1..3) when g_qx_wild is 2 / 3 / 4. */
static int g_qx_wild;
/* test_qgemm / test_qgemm_invariance: repack W8A16 / INT4 weights into the
 * tiled layout after upload (loom_cuda_qweight_tile; a shape that does not
 * tile fails the test) */
static bool g_q_tile;

/* Quantize random weights on the host exactly as loom/quant.h lays them
 * out, run loom_cuda_qgemm_run, and compare with a float64 reference over
 * the SAME quantized weights — and, for W8A8 / FP8, the same per-token
 * quantized activations, computed here with kernels/cpu/qlinear.c's float32
 * arithmetic. path: 0 the default dispatch, 1 the GEMV forced (passes of 8
 * rows at any M; W8A16 / INT4 above 8 rows only at shapes qmma.cu does not
 * take, which keeps them at 9..128 rows: a call that ran it fails), 2 the
 * GEMM path forced (dequantize + cuBLASLt, or the FP8 / int8 cuBLASLt GEMM
 * + epilogue, at any M). */
static void test_qgemm(loom_cuda_gemm *g, loom_cuda_dt dt, loom_cuda_qfmt fmt, int M, int N,
                       int K, int group, int path, bool out_f32, bool smooth) {
    const bool i4 = fmt == LOOM_CUDA_Q_INT4, acts = fmt == LOOM_CUDA_Q_INT8_W8A8 || fmt == LOOM_CUDA_Q_FP8;
    const int ng = i4 ? K / group : 1;
    const size_t data_bytes = i4 ? (size_t)N * K / 2 : (size_t)N * K;
    uint8_t *data = calloc(data_bytes, 1);
    float *scales = malloc((size_t)N * (i4 ? ng * 2 : 1) * 4);
    double *wd = malloc((size_t)N * K * 8); /* decoded weights */
    float *wrow = malloc((size_t)K * 4);
    for (int n = 0; n < N; n++) {
        const float amp = gpu_rng_unif(0.02f, 2.0f); /* rows of different magnitude */
        for (int k = 0; k < K; k++) wrow[k] = amp * gpu_rng_unif(-1, 1);
        if (n == 3 && N > 8) memset(wrow, 0, (size_t)K * 4); /* an all-zero row: scale 0 */
        if (i4) {
            for (int gi = 0; gi < ng; gi++) {
                float lo = wrow[gi * group], hi = lo;
                for (int k = gi * group; k < (gi + 1) * group; k++)
                    lo = fminf(lo, wrow[k]), hi = fmaxf(hi, wrow[k]);
                float s = (hi - lo) / 15.0f, z = s > 0 ? -lo / s : 0.0f;
                z += gpu_rng_unif(-0.3f, 0.3f); /* a float zero, not an integer */
                scales[((size_t)n * ng + gi) * 2] = s;
                scales[((size_t)n * ng + gi) * 2 + 1] = -(z * s);
                for (int k = gi * group; k < (gi + 1) * group; k++) {
                    float qf = s > 0 ? rintf(wrow[k] / s + z) : 0.0f;
                    int q = qf < 0 ? 0 : qf > 15 ? 15 : (int)qf;
                    data[(size_t)n * (K / 2) + k / 2] |= (uint8_t)(k % 2 ? q << 4 : q);
                    wd[(size_t)n * K + k] = ((double)q - (double)z) * (double)s;
                }
            }
        } else {
            float amax = 0;
            for (int k = 0; k < K; k++) amax = fmaxf(amax, fabsf(wrow[k]));
            const bool f8 = fmt == LOOM_CUDA_Q_FP8;
            float s = amax / (f8 ? 448.0f : 127.0f);
            scales[n] = s;
            for (int k = 0; k < K; k++) {
                uint8_t c;
                double v;
                if (f8) {
                    c = s > 0 ? e4m3_enc(wrow[k] / s) : 0;
                    v = e4m3_dec(c);
                } else {
                    float q = s > 0 ? rintf(wrow[k] * (127.0f / amax)) : 0.0f;
                    q = q > 127 ? 127 : q < -127 ? -127 : q;
                    c = (uint8_t)(int8_t)q;
                    v = (double)(int8_t)c;
                }
                data[(size_t)n * K + k] = c;
                wd[(size_t)n * K + k] = v * (double)s;
            }
        }
    }
    /* activations: dt, then (W8A8 / FP8) the codes and scales the device
     * must produce */
    float *xf = malloc((size_t)M * K * 4), *sm = NULL;
    uint16_t *x = rand16(dt, (size_t)M * K, -2, 2, xf);
    if (g_qx_wild) /* tokens 1, 2, 3 (mod 4): beyond f16's range (bf16 only), tiny, powers of two;
                    * a single token: the first of these */
        for (int m = M == 1 ? 0 : 1; m < M; m++) {
            const int kind = M == 1 ? (g_qx_wild >= 2 ? g_qx_wild : 1) : m % 4;
            const float f = kind == 1 ? (dt == LOOM_CUDA_BF16 ? 5e4f : 2e3f) : kind == 2 ? 1e-6f : 1.0f;
            for (int k = 0; k < K; k++) {
                size_t i = (size_t)m * K + k;
                float v = kind == 3   ? ldexpf(k % 2 ? -1.0f : 1.0f, k % 23 - 11)
                          : kind == 4 ? fabsf(xf[i]) + 1.0f /* one sign: offsets cancel badly */
                                      : xf[i] * f;
                x[i] = to16(dt, v), xf[i] = (float)from16(dt, x[i]);
            }
        }
    if (M > 2) for (int k = 0; k < K; k++) x[k] = to16(dt, 0.0f), xf[k] = 0.0f; /* zero token */
    if (smooth) {
        sm = malloc((size_t)K * 4);
        for (int k = 0; k < K; k++) sm[k] = gpu_rng_unif(0.5f, 2.0f);
    }
    double *xr = malloc((size_t)M * K * 8), *sx = malloc((size_t)M * 8);
    for (int m = 0; m < M; m++) {
        const float *r = xf + (size_t)m * K;
        sx[m] = 1.0;
        if (!acts) {
            for (int k = 0; k < K; k++) xr[(size_t)m * K + k] = r[k];
            continue;
        }
        float amax = 0;
        for (int k = 0; k < K; k++) amax = fmaxf(amax, fabsf(sm ? r[k] / sm[k] : r[k]));
        if (fmt == LOOM_CUDA_Q_FP8) {
            float s = amax / 448.0f;
            sx[m] = s;
            for (int k = 0; k < K; k++)
                xr[(size_t)m * K + k] = s > 0 ? e4m3_dec(e4m3_enc((sm ? r[k] / sm[k] : r[k]) / s)) : 0;
        } else {
            float inv = amax > 0 ? 127.0f / amax : 0.0f;
            sx[m] = amax / 127.0f;
            for (int k = 0; k < K; k++) {
                float v = rintf((sm ? r[k] / sm[k] : r[k]) * inv);
                xr[(size_t)m * K + k] = v > 127 ? 127 : v < -127 ? -127 : v;
            }
        }
    }
    void *d_data = dev_upload(data, data_bytes);
    float *d_sc = dev_upload(scales, (size_t)N * (i4 ? ng * 2 : 1) * 4);
    float *d_sm = sm ? dev_upload(sm, (size_t)K * 4) : NULL;
    void *d_x = dev_upload(x, (size_t)M * K * 2);
    const size_t oel = out_f32 ? 4 : 2;
    void *d_y = dev_poison((size_t)M * N * oel);
    loom_cuda_qweight w = {.fmt = fmt, .N = N, .K = K, .group = i4 ? group : 0, .data = d_data,
                           .scales = d_sc, .smooth = d_sm};
    int tile_rc = 0;
    if (g_q_tile) tile_rc = (int)loom_cuda_qweight_tile(&w, dt, 0);
    if (path == 1) loom_cuda_qgemm_set_gemv_max_m(g, fmt, 256);
    if (path == 2) loom_cuda_qgemm_set_gemv_max_m(g, fmt, 0);
    const size_t sb = loom_cuda_qgemm_scratch_bytes(g, dt, out_f32, &w, M);
    void *d_s = dev_poison(sb);
    char msg[256] = "";
    long tc0, cc0, tc1, cc1, v0, e0, v1, e1;
    lc_qgemv_count(&tc0, &cc0);
    lc_qgemm_fp8_count(&v0, &e0);
    const long q0 = lc_qgemm_qmma_count(), t0 = lc_qgemm_qtiled_count(), wg0 = lc_qtiled_wgmma_count();
    int rc = tile_rc ? 10000 + tile_rc : loom_cuda_qgemm_run(g, dt, out_f32, M, &w, d_x, d_y, d_s, sb, 0, msg, sizeof msg);
    if (tile_rc) snprintf(msg, sizeof msg, "loom_cuda_qweight_tile: %s", cudaGetErrorString((cudaError_t)tile_rc));
    const bool qmma = lc_qgemm_qmma_count() > q0, tiled = lc_qgemm_qtiled_count() > t0;
    const bool wgmma = lc_qtiled_wgmma_count() > wg0;
    if (!rc && path == 1 && qmma) {
        snprintf(msg, sizeof msg, "path 1 (the GEMV) ran qmma.cu's kernel: pick a shape it does not take");
        rc = -1;
    }
    lc_qgemv_count(&tc1, &cc1);
    lc_qgemm_fp8_count(&v1, &e1);
    qgemm_defaults(g);
    CK(cudaDeviceSynchronize());
    char name[160];
    char gs[16] = "";
    if (i4) snprintf(gs, sizeof gs, " g%d", group);
    /* which GEMV kernels ran (qgemv_tc.cu's, qgemm.cu's), when one did */
    const char *kern = tc1 > tc0 ? (cc1 > cc0 ? " tc+cc" : " tc") : cc1 > cc0 ? " cc" : "";
    /* an FP8 GEMM: cuBLASLt's scale vectors, or unit scales + the epilogue */
    if (v1 > v0 || e1 > e0) kern = v1 > v0 ? (e1 > e0 ? " scale-vec+epilogue" : " scale-vec") : " epilogue";
    if (qmma) kern = " qmma";
    if (tiled) kern = wgmma ? " tiled-wgmma" : " tiled";
    else if (g_q_tile) kern = " tiled+dequant";
    char wild[16] = "";
    if (g_qx_wild) snprintf(wild, sizeof wild, M == 1 && g_qx_wild >= 2 ? " wild%d" : " wild", g_qx_wild);
    snprintf(name, sizeof name, "qgemm %s %s M=%d N=%d K=%d%s%s%s%s%s -> %s", qfmt_name(fmt), dtn(dt),
             M, N, K, gs, path == 1 ? " gemv" : path == 2 ? " gemm" : "", kern,
             smooth ? " smooth" : "", wild, out_f32 ? "f32" : dtn(dt));
    err_acc a = {0};
    if (rc) {
        printf("      qgemm error: %s\n", msg);
        a.nan = true;
        report(name, &a, TOL16);
    } else {
        void *y = malloc((size_t)M * N * oel);
        CK(cudaMemcpy(y, d_y, (size_t)M * N * oel, cudaMemcpyDeviceToHost));
        double *out = malloc((size_t)M * N * 8), *ref = malloc((size_t)M * N * 8);
#pragma omp parallel for schedule(dynamic, 1)
        for (int m = 0; m < M; m++)
            for (int n = 0; n < N; n++) {
                double acc = 0;
                const double *xm = xr + (size_t)m * K, *wn = wd + (size_t)n * K;
                for (int k = 0; k < K; k++) acc += xm[k] * wn[k];
                ref[(size_t)m * N + n] = acc * sx[m];
                out[(size_t)m * N + n] = out_f32 ? ((float *)y)[(size_t)m * N + n]
                                                 : from16(dt, ((uint16_t *)y)[(size_t)m * N + n]);
            }
        for (int m = 0; m < M; m++) {
            if (M > 2 && m == 0) { /* the zero token: exact zeros */
                for (int n = 0; n < N; n++)
                    if (out[n] != 0.0) a.nan = true;
                continue;
            }
            err_row(&a, out + (size_t)m * N, ref + (size_t)m * N, N);
        }
        /* GEMV with f32 output is fp32 all the way; the GEMM paths round
         * the dequantized weights (W8A16 / INT4) or the unscaled sums
         * (FP8 into bf16) to 16 bits; qmma.cu's tensor-core kernel does
         * not (exact products, fp32 sums) */
        /* (the tiled kernel: exact int8 codes, fp32 sums; INT4 forms
         * (q - 8) s + b' with s, b' rounded to dt, the precision class of the
         * dequantize path) */
        const bool exact32 = out_f32 && (tiled ? fmt == LOOM_CUDA_Q_INT8_W8A16
                                               : g_q_tile ? false : (path == 1 || (path == 0 && M <= 8) || qmma));
        report(name, &a, exact32 ? 1e-4 : TOL16);
        free(y), free(out), free(ref);
    }
    cudaFree(d_data), cudaFree(d_sc), cudaFree(d_sm), cudaFree(d_x), cudaFree(d_y), cudaFree(d_s);
    free(data), free(scales), free(wd), free(wrow), free(xf), free(sm), free(x), free(xr), free(sx);
}

/* int8 W8A8 at M = 2..8 on the tensor-core GEMV vs the CUDA-core one: both
 * sum int32 exactly and scale with the same expression, so every output
 * bit must agree. Random codes and scales (the arithmetic is test_qgemm's
 * business). */
static void test_qgemm_tc_bits(loom_cuda_gemm *g, loom_cuda_dt dt, int N, int K, bool out_f32) {
    const size_t oel = out_f32 ? 4 : 2;
    uint8_t *data = malloc((size_t)N * K);
    float *sc = malloc((size_t)N * 4);
    for (size_t i = 0; i < (size_t)N * K; i++) data[i] = (uint8_t)(int8_t)(rng_int(255) - 127);
    for (int n = 0; n < N; n++) sc[n] = gpu_rng_unif(0.001f, 0.02f);
    uint16_t *x = rand16(dt, (size_t)8 * K, -2, 2, NULL);
    void *d_data = dev_upload(data, (size_t)N * K), *d_sc = dev_upload(sc, (size_t)N * 4);
    void *d_x = dev_upload(x, (size_t)8 * K * 2);
    const loom_cuda_qweight w = {.fmt = LOOM_CUDA_Q_INT8_W8A8, .N = N, .K = K, .data = d_data, .scales = d_sc};
    const size_t scr = loom_cuda_qgemm_scratch_bytes(g, dt, out_f32, &w, 8);
    void *d_scr = dev_poison(scr), *d_y = dev_poison((size_t)8 * N * oel);
    char *a = malloc((size_t)8 * N * oel), *b = malloc((size_t)8 * N * oel), msg[256] = "", name[160];
    for (int M = 2; M <= 8; M += 3) {
        int rc = 0;
        long tc0, cc0, tc1, cc1;
        lc_qgemv_count(&tc0, &cc0);
        for (int on = 1; on >= 0 && !rc; on--) {
            loom_cuda_qgemm_set_tc_min_m(g, on ? 0 : 9); /* the default bound (2 for W8A8), or never */
            CK(cudaMemset(d_y, 0xff, (size_t)8 * N * oel));
            rc = loom_cuda_qgemm_run(g, dt, out_f32, M, &w, d_x, d_y, d_scr, scr, 0, msg, sizeof msg);
            CK(cudaDeviceSynchronize());
            CK(cudaMemcpy(on ? a : b, d_y, (size_t)M * N * oel, cudaMemcpyDeviceToHost));
        }
        lc_qgemv_count(&tc1, &cc1);
        snprintf(name, sizeof name, "qgemm int8_w8a8 %s M=%d N=%d K=%d -> %s: tc bits = cc bits", dtn(dt),
                 M, N, K, out_f32 ? "f32" : dtn(dt));
        if (rc) printf("      qgemm error: %s\n", msg);
        /* both kernels must have run, or the comparison says nothing */
        const long bad = rc || tc1 == tc0 || cc1 == cc0 ? 1 : bits_differ(a, b, (size_t)M * N, oel) +
                                                                 count_nan(dt, a, (size_t)M * N, oel);
        report_bits(name, bad, M);
    }
    loom_cuda_qgemm_set_tc_min_m(g, 0);
    cudaFree(d_data), cudaFree(d_sc), cudaFree(d_x), cudaFree(d_scr), cudaFree(d_y);
    free(data), free(sc), free(x), free(a), free(b);
}

/* Random one-byte codes (int8, or e4m3 without its NaN codes) of an N x K
 * weight and per-channel scales, for tests that compare two paths. */
static void rand_q8_weight(loom_cuda_qfmt fmt, int N, int K, uint8_t *data, float *sc) {
    for (size_t i = 0; i < (size_t)N * K; i++) {
        uint8_t b = (uint8_t)rng_int(256);
        if (fmt == LOOM_CUDA_Q_FP8 && (b & 0x7F) == 0x7F) b ^= 1;
        data[i] = b;
    }
    for (int n = 0; n < N; n++) sc[n] = gpu_rng_unif(0.001f, 0.02f);
}

/* A random quantized N x K weight on the device (W8A16 / W8A8 / FP8 codes
 * with per-row scales, or INT4 nibbles with {scale, bias} pairs per group
 * of 128), for tests that compare two paths over the same weight; its
 * buffers are qw.data and qw.scales (cudaFree both). */
static loom_cuda_qweight dev_rand_qweight(loom_cuda_qfmt f, int N, int K) {
    const bool i4 = f == LOOM_CUDA_Q_INT4;
    loom_cuda_qweight qw = {.fmt = f, .N = N, .K = K, .group = i4 ? 128 : 0};
    const size_t wbytes = i4 ? (size_t)N * K / 2 : (size_t)N * K;
    const size_t nsc = i4 ? (size_t)N * (K / 128) * 2 : (size_t)N;
    uint8_t *data = malloc((size_t)N * K);
    float *sc = malloc(nsc * 4);
    if (i4) {
        for (size_t i = 0; i < wbytes; i++) data[i] = (uint8_t)rng_int(256);
        for (size_t i = 0; i < nsc; i++) sc[i] = gpu_rng_unif(-0.01f, 0.01f);
    } else {
        rand_q8_weight(f, N, K, data, sc);
    }
    qw.data = dev_upload(data, wbytes), qw.scales = dev_upload(sc, nsc * 4);
    free(data), free(sc);
    return qw;
}

/* The tensor-core GEMV's row bound (loom_cuda_qgemm_set_tc_min_m, the cuda
 * backend's qgemv_tc_min_rows) decides which kernel a call runs: 0 the
 * measured default (W8A8 / FP8 from 2 rows, INT4 from 3), 1..8 that many
 * rows for every format, 9 never; W8A16 never takes it, nor does the
 * batch-invariant mode. Then, with the bound at 1, one row of each format
 * on the tensor-core kernel against the float64 reference (no default
 * dispatch runs it there). */
static void test_qgemm_tc_min_m(loom_cuda_gemm *g) {
    static const struct { loom_cuda_qfmt f; int M, min_m, inv; bool tc; } cs[] = {
        {LOOM_CUDA_Q_INT4, 2, 0, 0, false},      {LOOM_CUDA_Q_INT4, 3, 0, 0, true},
        {LOOM_CUDA_Q_INT4, 2, 2, 0, true},       {LOOM_CUDA_Q_FP8, 2, 0, 0, true},
        {LOOM_CUDA_Q_FP8, 2, 3, 0, false},       {LOOM_CUDA_Q_INT8_W8A8, 8, 8, 0, true},
        {LOOM_CUDA_Q_INT8_W8A8, 8, 9, 0, false}, {LOOM_CUDA_Q_FP8, 1, 0, 0, false},
        {LOOM_CUDA_Q_FP8, 1, 1, 0, true},        {LOOM_CUDA_Q_INT8_W8A16, 4, 1, 0, false},
        {LOOM_CUDA_Q_INT8_W8A8, 4, 1, 1, false},
    };
    const int N = 256, K = 1024;
    const loom_cuda_dt dt = LOOM_CUDA_BF16;
    char msg[256] = "", name[160];
    uint16_t *x = rand16(dt, (size_t)8 * K, -2, 2, NULL);
    void *d_x = dev_upload(x, (size_t)8 * K * 2), *d_y = dev_poison((size_t)8 * N * 2);
    for (size_t ci = 0; ci < sizeof cs / sizeof cs[0]; ci++) {
        const loom_cuda_qweight w = dev_rand_qweight(cs[ci].f, N, K);
        loom_cuda_gemm_set_batch_invariant(g, cs[ci].inv);
        loom_cuda_qgemm_set_tc_min_m(g, cs[ci].min_m);
        const size_t scr = loom_cuda_qgemm_scratch_bytes(g, dt, 0, &w, cs[ci].M);
        void *d_scr = scr ? dev_poison(scr) : NULL;
        long tc0, cc0, tc1, cc1;
        lc_qgemv_count(&tc0, &cc0);
        const int rc = loom_cuda_qgemm_run(g, dt, 0, cs[ci].M, &w, d_x, d_y, d_scr, scr, 0, msg, sizeof msg);
        CK(cudaDeviceSynchronize());
        lc_qgemv_count(&tc1, &cc1);
        const bool ran_tc = tc1 > tc0 && cc1 == cc0, ran_cc = cc1 > cc0 && tc1 == tc0;
        snprintf(name, sizeof name, "qgemm %s M=%d, tensor-core bound %d%s: the %s kernel",
                 qfmt_name(cs[ci].f), cs[ci].M, cs[ci].min_m, cs[ci].inv ? ", batch-invariant" : "",
                 cs[ci].tc ? "tensor-core" : "CUDA-core");
        if (rc) printf("      qgemm error: %s\n", msg);
        report_bits(name, !rc && (cs[ci].tc ? ran_tc : ran_cc) ? 0 : 1, 1);
        cudaFree((void *)w.data), cudaFree((void *)w.scales), cudaFree(d_scr);
    }
    loom_cuda_gemm_set_batch_invariant(g, 0);
    loom_cuda_qgemm_set_tc_min_m(g, 1);
    test_qgemm(g, LOOM_CUDA_BF16, LOOM_CUDA_Q_INT8_W8A8, 1, 515, 2048, 0, 0, true, false);
    test_qgemm(g, LOOM_CUDA_BF16, LOOM_CUDA_Q_FP8, 1, 515, 2048, 0, 0, true, false);
    test_qgemm(g, LOOM_CUDA_F16, LOOM_CUDA_Q_INT4, 1, 515, 2048, 128, 0, false, false);
    loom_cuda_qgemm_set_tc_min_m(g, 0);
    cudaFree(d_x), cudaFree(d_y);
    free(x);
}

/* The one-row GEMVs' pair epilogues (cuda_kernels.h: loom_cuda_epi) change
 * which kernel does the work, never its bits: the fused entry point and the
 * GEMM followed by the separate kernel (loom_cuda_rope_kv / _swiglu) called
 * by hand give the same y, act and KV caches, bit for bit, for bf16 weights
 * and every quantized format, bf16 / f16, W8A16 and INT4 also tiled
 * (qtiled.cu: in its K-split reduce; the entry point runs the separate
 * kernel after it where K is not split — column tf says which the case
 * expects). RoPE + KV write: Llama-3-8B's heads (32 / 8 of 128) and small
 * ones (4 / 2 of 64 and of 128, 6 / 6 of 16), with and without the QKV
 * bias, dt and E4M3 caches, a token with a slot and one without (slot -1:
 * no cache write); SwiGLU: a Llama-3-8B-sized gate|up and small ones. The
 * fused launch must have run (loom_cuda_epi_fused_count), once — on a
 * tiled weight once where tf, else never.
 * The quantized formats go through the norm-quantize entry points, as a
 * step does; the residual is left as it is (r NULL) so both runs see one x.
 * The separate run in batch-invariant mode, so that its GEMV is unsplit
 * (the fused kernel sums each row whole, and a split one adds its halves
 * in another order — the epilogue's arithmetic is what is checked here);
 * at one row that mode changes nothing else of the call. A tiled weight
 * runs the same launch of qtiled.cu's kernel in both runs, so both are in
 * one mode: the ordinary one, then batch-invariant (INT4's other decode). */
static void test_pair_epilogue(loom_cuda_gemm *g) {
    /* tf: a tiled weight fuses — its one row splits K (qtiled.cu's
     * lc_qt_splits: at most 132 CTAs of 128 rows and K / 128 >= 8) */
    static const struct { int kind, H, KVH, D, K, bias, f8, slot, tf; } cases[] = {
        {LOOM_CUDA_EPI_ROPE_KV, 32, 8, 128, 4096, 0, 0, 1, 1}, {LOOM_CUDA_EPI_ROPE_KV, 4, 2, 64, 576, 1, 0, 1, 0},
        {LOOM_CUDA_EPI_ROPE_KV, 4, 2, 64, 576, 1, 1, 1, 0},    {LOOM_CUDA_EPI_ROPE_KV, 6, 6, 16, 256, 0, 1, 0, 0},
        /* small heads (P = 8), a longer row: bias, E4M3 cache */
        {LOOM_CUDA_EPI_ROPE_KV, 6, 6, 16, 2048, 1, 1, 1, 1},
        {LOOM_CUDA_EPI_SWIGLU, 14336, 0, 0, 4096, 0, 0, 0, 0},
        {LOOM_CUDA_EPI_SWIGLU, 1536, 0, 0, 576, 0, 0, 0, 0},
        /* K % 128, so INT4 and the tiled weights run too: bias, E4M3 cache,
         * no slot; a gate|up of 194 row tiles (K not split: unfused) */
        {LOOM_CUDA_EPI_ROPE_KV, 4, 2, 64, 512, 1, 1, 0, 0},
        {LOOM_CUDA_EPI_ROPE_KV, 4, 2, 64, 512, 1, 0, 1, 0},
        {LOOM_CUDA_EPI_SWIGLU, 1552, 0, 0, 512, 0, 0, 0, 0},
        /* a longer row of the small heads, K % 128 */
        {LOOM_CUDA_EPI_ROPE_KV, 4, 2, 64, 2048, 1, 0, 1, 1},
        /* tiled, unsplit: heads of 128, bias and E4M3 cache; a gate|up of
         * P = 1024; split: a gate|up of P = 512 */
        {LOOM_CUDA_EPI_ROPE_KV, 4, 2, 128, 512, 1, 1, 1, 0},
        {LOOM_CUDA_EPI_SWIGLU, 1024, 0, 0, 512, 0, 0, 0, 0},
        {LOOM_CUDA_EPI_SWIGLU, 512, 0, 0, 4096, 0, 0, 0, 1},
    };
    /* the last two: W8A16 and INT4 tiled (qtiled.cu's kernel) */
    static const loom_cuda_qfmt fmts[7] = {LOOM_CUDA_Q_NONE, LOOM_CUDA_Q_INT8_W8A16, LOOM_CUDA_Q_INT8_W8A8,
                                           LOOM_CUDA_Q_FP8,  LOOM_CUDA_Q_INT4,       LOOM_CUDA_Q_INT8_W8A16,
                                           LOOM_CUDA_Q_INT4};
    char msg[256] = "", name[240];
    const int bs = 16, nblk = 4, max_pos = 512;
    for (size_t ci = 0; ci < sizeof cases / sizeof cases[0]; ci++) {
        const bool rope = cases[ci].kind == LOOM_CUDA_EPI_ROPE_KV;
        const int H = cases[ci].H, KVH = cases[ci].KVH, D = cases[ci].D, K = cases[ci].K;
        const int N = rope ? (H + 2 * KVH) * D : 2 * H, I = H;
        const size_t kve = cases[ci].f8 ? 1 : 2, cache = rope ? (size_t)nblk * KVH * bs * D : 0;
        /* RoPE table of random angles' cos / sin, a position, a slot */
        float *cs = malloc((size_t)max_pos * (D > 0 ? D : 2) * 4), *bias = malloc((size_t)N * 4);
        for (int i = 0; i < max_pos * (D > 0 ? D : 2) / 2; i++) {
            const float a = gpu_rng_unif(-3.2f, 3.2f);
            cs[2 * i] = cosf(a), cs[2 * i + 1] = sinf(a);
        }
        for (int i = 0; i < N; i++) bias[i] = gpu_rng_unif(-0.5f, 0.5f);
        const int32_t pos = rng_int(max_pos);
        const int64_t slot = cases[ci].slot ? rng_int(nblk * bs) : -1;
        void *d_cs = dev_upload(cs, (size_t)max_pos * (D > 0 ? D : 2) * 4), *d_bias = dev_upload(bias, (size_t)N * 4);
        void *d_pos = dev_upload(&pos, 4), *d_slot = dev_upload(&slot, 8);
        for (int di = 0; di < 2; di++) {
            const loom_cuda_dt dt = di ? LOOM_CUDA_F16 : LOOM_CUDA_BF16;
            float *xres = malloc((size_t)K * 4), *nw = malloc((size_t)K * 4);
            for (int k = 0; k < K; k++) xres[k] = gpu_rng_unif(-2, 2), nw[k] = gpu_rng_unif(0.5f, 1.5f);
            uint16_t *xn = rand16(dt, (size_t)K, -1, 1, NULL), *wb = NULL;
            float *d_xres = dev_upload(xres, (size_t)K * 4), *d_nw = dev_upload(nw, (size_t)K * 4);
            void *d_xn = dev_upload(xn, (size_t)K * 2);
            for (int fi = 0; fi < 7; fi++) {
                const loom_cuda_qfmt f = fmts[fi];
                const bool i4 = f == LOOM_CUDA_Q_INT4, tiled = fi >= 5;
                if ((i4 || tiled) && K % 128) continue;
                loom_cuda_qweight qw = {.fmt = f, .N = N, .K = K};
                void *d_w = NULL, *d_sc = NULL;
                if (f == LOOM_CUDA_Q_NONE) {
                    wb = rand16(dt, (size_t)N * K, -0.05f, 0.05f, NULL);
                    d_w = dev_upload(wb, (size_t)N * K * 2);
                    free(wb);
                } else {
                    qw = dev_rand_qweight(f, N, K);
                    d_w = (void *)qw.data, d_sc = (void *)qw.scales;
                    if (tiled) CK(loom_cuda_qweight_tile(&qw, dt, 0));
                }
                const long want = !tiled || cases[ci].tf;
                /* (the most either mode asks: tiled runs both) */
                size_t scr = f == LOOM_CUDA_Q_NONE ? 0 : loom_cuda_qgemm_scratch_bytes(g, dt, 0, &qw, 1);
                if (f != LOOM_CUDA_Q_NONE) {
                    loom_cuda_gemm_set_batch_invariant(g, 1);
                    const size_t si = loom_cuda_qgemm_scratch_bytes(g, dt, 0, &qw, 1);
                    loom_cuda_gemm_set_batch_invariant(g, 0);
                    if (si > scr) scr = si;
                }
                void *d_scr = scr ? dev_poison(scr) : NULL;
                for (int inv = 0; inv < (tiled ? 2 : 1); inv++) {
                    /* per run: y, act / k, v caches, copied back */
                    char *out[2][3] = {{0}};
                    const size_t sz[3] = {(size_t)N * 2, rope ? cache * kve : (size_t)I * 2, rope ? cache * kve : 0};
                    long fused[2] = {0, 0};
                    int rc = 0;
                    for (int run = 0; run < 2 && !rc; run++) { /* fused, then the separate kernel by hand */
                        /* (tiled: the same launch of qtiled.cu's kernel both times) */
                        loom_cuda_gemm_set_batch_invariant(g, tiled ? inv : run == 1);
                        void *d_y = dev_poison(sz[0]), *d_a = dev_poison(sz[1] ? sz[1] : 16),
                             *d_v = dev_poison(sz[2] ? sz[2] : 16);
                        loom_cuda_epi e = {.kind = (loom_cuda_epi_kind)cases[ci].kind};
                        if (rope)
                            e = (loom_cuda_epi){.kind = LOOM_CUDA_EPI_ROPE_KV,
                                                .kv = cases[ci].f8 ? LOOM_CUDA_KV_E4M3 : LOOM_CUDA_KV_DT,
                                                .bias = cases[ci].bias ? d_bias : NULL, .cs = d_cs, .pos = d_pos,
                                                .slot = d_slot, .k_cache = d_a, .v_cache = d_v, .num_heads = H,
                                                .num_kv_heads = KVH, .head_dim = D, .block_size = bs};
                        else
                            e.act = d_a;
                        const long c0 = loom_cuda_epi_fused_count();
                        if (run == 0) {
                            rc = f == LOOM_CUDA_Q_NONE
                                     ? loom_cuda_gemm_epi_run(g, dt, 1, N, K, d_xn, d_w, d_y, &e, 0, msg, sizeof msg)
                                     : loom_cuda_qgemm_norm_epi_run(g, dt, 1, &qw, d_xres, NULL, d_nw, 1e-5f, d_xn, d_y,
                                                                    &e, d_scr, scr, 0, msg, sizeof msg);
                        } else {
                            rc = f == LOOM_CUDA_Q_NONE
                                     ? loom_cuda_gemm_run(g, dt, 0, 1, N, K, d_xn, d_w, d_y, 0, msg, sizeof msg)
                                     : loom_cuda_qgemm_norm_run(g, dt, 1, &qw, d_xres, NULL, d_nw, 1e-5f, d_xn, d_y, d_scr,
                                                                scr, 0, msg, sizeof msg);
                            if (!rc && rope)
                                CK(loom_cuda_rope_kv(dt, e.kv, d_y, N, e.bias, d_cs, d_pos, d_slot, d_a, d_v, 1, H, KVH, D,
                                                     bs, 0));
                            else if (!rc)
                                CK(loom_cuda_swiglu(dt, d_a, d_y, 1, I, 0));
                        }
                        CK(cudaDeviceSynchronize());
                        fused[run] = loom_cuda_epi_fused_count() - c0;
                        void *dev[3] = {d_y, d_a, d_v};
                        for (int b = 0; b < 3; b++) {
                            out[run][b] = malloc(sz[b] ? sz[b] : 1);
                            if (sz[b]) CK(cudaMemcpy(out[run][b], dev[b], sz[b], cudaMemcpyDeviceToHost));
                        }
                        cudaFree(d_y), cudaFree(d_a), cudaFree(d_v);
                    }
                    long differ = rc ? 1 : 0;
                    for (int b = 0; b < 3 && !rc; b++) differ += bits_differ(out[0][b], out[1][b], sz[b], 1);
                    /* the fused launch ran, once */
                    if (fused[0] != want || fused[1] != 0) differ++;
                    /* something was written: y has no poison left */
                    if (!rc) differ += count_nan(dt, out[0][0], (size_t)N, 2);
                    snprintf(name, sizeof name,
                             "pair epilogue %s %s %s%s N=%d K=%d%s%s%s: fused = separate kernel, bit for bit",
                             rope ? "rope_kv" : "swiglu", dtn(dt), f == LOOM_CUDA_Q_NONE ? "bf16-weights" : qfmt_name(f),
                             tiled ? (inv ? " tiled invariant" : " tiled") : "", N, K, rope && cases[ci].bias ? " bias" : "",
                             rope && cases[ci].f8 ? " e4m3-KV" : "", rope && slot < 0 ? " no slot" : "");
                    if (rc) printf("      error: %s\n", msg);
                    if (fused[0] != want || fused[1]) printf("      fused launches %ld / %ld\n", fused[0], fused[1]);
                    report_bits(name, differ, 1);
                    for (int r = 0; r < 2; r++)
                        for (int b = 0; b < 3; b++) free(out[r][b]);
                }
                cudaFree(d_w), cudaFree(d_sc), cudaFree(d_scr);
            }
            cudaFree(d_xres), cudaFree(d_nw), cudaFree(d_xn);
            free(xres), free(nw), free(xn);
        }
        cudaFree(d_cs), cudaFree(d_bias), cudaFree(d_pos), cudaFree(d_slot);
        free(cs), free(bias);
    }
    loom_cuda_gemm_set_batch_invariant(g, 0);
}

/* Where the one-row CUDA-core GEMV is not what runs, the pair epilogue
 * entry points must not fuse and must still finish every row: three rows
 * (bf16 weights; W8A8 through the norm-quantize entry point) — no fused
 * launch, and the bits of the GEMM + loom_cuda_rope_kv called by hand.
 * Llama-3-8B's QKV shape, three tokens at positions in three cache blocks. */
static void test_pair_epilogue_fallback(loom_cuda_gemm *g) {
    const int H = 32, KVH = 8, D = 128, K = 4096, N = (H + 2 * KVH) * D, bs = 16, nblk = 8, max_pos = 512;
    const loom_cuda_dt dt = LOOM_CUDA_BF16;
    char msg[256] = "", name[200];
    float *cs = malloc((size_t)max_pos * D * 4);
    for (int i = 0; i < max_pos * D / 2; i++) {
        const float a = gpu_rng_unif(-3.2f, 3.2f);
        cs[2 * i] = cosf(a), cs[2 * i + 1] = sinf(a);
    }
    const int32_t pos[3] = {rng_int(max_pos), rng_int(max_pos), rng_int(max_pos)};
    const int64_t slot[3] = {3, bs + 7, 5 * bs + 1};
    void *d_cs = dev_upload(cs, (size_t)max_pos * D * 4), *d_pos = dev_upload(pos, sizeof pos);
    void *d_slot = dev_upload(slot, sizeof slot);
    float *xres = malloc((size_t)3 * K * 4), *nw = malloc((size_t)K * 4);
    for (int k = 0; k < 3 * K; k++) xres[k] = gpu_rng_unif(-2, 2);
    for (int k = 0; k < K; k++) nw[k] = gpu_rng_unif(0.5f, 1.5f);
    uint16_t *xn = rand16(dt, (size_t)3 * K, -1, 1, NULL), *wb = rand16(dt, (size_t)N * K, -0.05f, 0.05f, NULL);
    float *d_xres = dev_upload(xres, (size_t)3 * K * 4), *d_nw = dev_upload(nw, (size_t)K * 4);
    void *d_xn = dev_upload(xn, (size_t)3 * K * 2), *d_wb = dev_upload(wb, (size_t)N * K * 2);
    const size_t cache = (size_t)nblk * KVH * bs * D * 2;
    static const struct { loom_cuda_qfmt f; int M; } cases[] = {{LOOM_CUDA_Q_NONE, 3}, {LOOM_CUDA_Q_INT8_W8A8, 3}};
    for (size_t ci = 0; ci < sizeof cases / sizeof cases[0]; ci++) {
        const loom_cuda_qfmt f = cases[ci].f;
        const int M = cases[ci].M;
        loom_cuda_qweight qw = {.fmt = f, .N = N, .K = K};
        void *d_w = NULL, *d_sc = NULL;
        if (f != LOOM_CUDA_Q_NONE) {
            qw = dev_rand_qweight(f, N, K);
            d_w = (void *)qw.data, d_sc = (void *)qw.scales;
        }
        const size_t scr = f == LOOM_CUDA_Q_NONE ? 0 : loom_cuda_qgemm_scratch_bytes(g, dt, 0, &qw, M);
        void *d_scr = scr ? dev_poison(scr) : NULL;
        const size_t sz[3] = {(size_t)M * N * 2, cache, cache};
        char *out[2][3] = {{0}};
        long fused[2] = {0, 0};
        int rc = 0;
        /* run 0: the entry point; 1: the GEMM + rope_kv by hand */
        for (int run = 0; run < 2 && !rc; run++) {
            void *d_y = dev_poison(sz[0]), *d_k = dev_poison(cache), *d_v = dev_poison(cache);
            const loom_cuda_epi e = {.kind = LOOM_CUDA_EPI_ROPE_KV, .kv = LOOM_CUDA_KV_DT, .cs = d_cs, .pos = d_pos,
                                     .slot = d_slot, .k_cache = d_k, .v_cache = d_v, .num_heads = H,
                                     .num_kv_heads = KVH, .head_dim = D, .block_size = bs};
            const long c0 = loom_cuda_epi_fused_count();
            if (run == 1) {
                rc = f == LOOM_CUDA_Q_NONE
                         ? loom_cuda_gemm_run(g, dt, 0, M, N, K, d_xn, d_wb, d_y, 0, msg, sizeof msg)
                         : loom_cuda_qgemm_norm_run(g, dt, M, &qw, d_xres, NULL, d_nw, 1e-5f, d_xn, d_y, d_scr, scr, 0,
                                                    msg, sizeof msg);
                if (!rc)
                    CK(loom_cuda_rope_kv(dt, LOOM_CUDA_KV_DT, d_y, N, NULL, d_cs, d_pos, d_slot, d_k, d_v, M, H, KVH,
                                         D, bs, 0));
            } else {
                rc = f == LOOM_CUDA_Q_NONE
                         ? loom_cuda_gemm_epi_run(g, dt, M, N, K, d_xn, d_wb, d_y, &e, 0, msg, sizeof msg)
                         : loom_cuda_qgemm_norm_epi_run(g, dt, M, &qw, d_xres, NULL, d_nw, 1e-5f, d_xn, d_y, &e,
                                                        d_scr, scr, 0, msg, sizeof msg);
            }
            CK(cudaDeviceSynchronize());
            fused[run] = loom_cuda_epi_fused_count() - c0;
            void *dev[3] = {d_y, d_k, d_v};
            for (int b = 0; b < 3; b++) {
                out[run][b] = malloc(sz[b]);
                CK(cudaMemcpy(out[run][b], dev[b], sz[b], cudaMemcpyDeviceToHost));
            }
            cudaFree(d_y), cudaFree(d_k), cudaFree(d_v);
        }
        long differ = rc ? 1 : 0;
        for (int b = 0; b < 3 && !rc; b++) differ += bits_differ(out[0][b], out[1][b], sz[b], 1);
        if (fused[0] || fused[1]) differ++;
        if (!rc) differ += count_nan(dt, out[0][0], (size_t)M * N, 2);
        snprintf(name, sizeof name, "pair epilogue declined: rope_kv %s M=%d: no fused launch, every row done",
                 f == LOOM_CUDA_Q_NONE ? "bf16-weights" : qfmt_name(f), M);
        if (rc) printf("      error: %s\n", msg);
        if (fused[0] || fused[1]) printf("      fused launches %ld / %ld\n", fused[0], fused[1]);
        report_bits(name, differ, 1);
        for (int r = 0; r < 2; r++)
            for (int b = 0; b < 3; b++) free(out[r][b]);
        cudaFree(d_w), cudaFree(d_sc), cudaFree(d_scr);
    }
    cudaFree(d_cs), cudaFree(d_pos), cudaFree(d_slot), cudaFree(d_xres), cudaFree(d_nw), cudaFree(d_xn), cudaFree(d_wb);
    free(cs), free(xres), free(nw), free(xn), free(wb);
}

/* The one-row CUDA-core GEMV with K split across a CTA's warps (qgemm.cu,
 * lc_qgemv_slices: 2 slices, their sums added in shared memory, where the
 * unsplit grid does not fill the GPU) against the float64 reference
 * (test_qgemm: float32 held to 1e-4), every format: Llama-3-8B's O and down
 * shapes, a row count that is no multiple of a CTA's rows (INT4: the
 * unsplit kernel runs, so no dead warp meets the barrier), short rows that
 * cannot give every lane a chunk a slice (unsplit), tokens of wild
 * magnitudes. Each call must run
 * split exactly where loom_cuda_qgemm_splits says, and on a GPU of 100+ SMs
 * that is wherever the shape allows (these grids, 512 CTAs at most, are
 * short of a wave there). Then: never in batch-invariant mode; the 8B O
 * projection (512 CTAs of W8A16) splits and gate|up (3584 CTAs) does not. */
static void test_qgemv_split(loom_cuda_gemm *g) {
    typedef struct { loom_cuda_qfmt fmt; loom_cuda_dt dt; int N, K, group; bool f32; } scase;
    char name[200];
    const scase cs[] = {
        {LOOM_CUDA_Q_INT8_W8A16, LOOM_CUDA_BF16, 4096, 4096, 0, true},
        {LOOM_CUDA_Q_INT8_W8A16, LOOM_CUDA_BF16, 4096, 14336, 0, true},
        {LOOM_CUDA_Q_INT8_W8A16, LOOM_CUDA_F16, 300, 4096, 0, false},
        {LOOM_CUDA_Q_INT8_W8A8, LOOM_CUDA_BF16, 4096, 4096, 0, true},
        {LOOM_CUDA_Q_INT8_W8A8, LOOM_CUDA_BF16, 300, 14336, 0, false},
        {LOOM_CUDA_Q_FP8, LOOM_CUDA_BF16, 4096, 14336, 0, true},
        {LOOM_CUDA_Q_FP8, LOOM_CUDA_F16, 300, 4096, 0, true},
        {LOOM_CUDA_Q_INT4, LOOM_CUDA_BF16, 4096, 4096, 128, true},
        {LOOM_CUDA_Q_INT4, LOOM_CUDA_BF16, 4096, 14336, 128, true},
        {LOOM_CUDA_Q_INT4, LOOM_CUDA_F16, 300, 8192, 256, true},
    };
    int sms = 0;
    cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0);
    for (int wild = 0; wild < 5; wild++)
        for (size_t ci = 0; ci < sizeof cs / sizeof cs[0]; ci++) {
            const scase c = cs[ci];
            if (wild && (!c.f32 || ci % 2)) continue;
            g_qx_wild = wild;
            const loom_cuda_qweight probe = {.fmt = c.fmt, .N = c.N, .K = c.K, .group = c.group,
                                             .data = (void *)256, .scales = (float *)256};
            const int says = loom_cuda_qgemm_splits(g, c.dt, &probe);
            const long s0 = lc_qgemv_split_count();
            test_qgemm(g, c.dt, c.fmt, 1, c.N, c.K, c.group, 0, c.f32, false);
            /* the shape allows it where the rows of a CTA / 2 divide N and
             * each lane has a chunk of both slices */
            const int R = c.fmt == LOOM_CUDA_Q_INT4 ? 4 : 2, chunks = (c.fmt == LOOM_CUDA_Q_INT4 ? c.K / 2 : c.K) / 16;
            const bool can = c.N % (2 * R) == 0 && chunks % 2 == 0 && chunks / 2 >= 32;
            snprintf(name, sizeof name, "qgemv %s %s M=1 N=%d K=%d wild%d: %s", qfmt_name(c.fmt), dtn(c.dt), c.N,
                     c.K, wild, says ? "ran split" : "ran unsplit");
            report_bits(name, (lc_qgemv_split_count() > s0) == (says != 0) && (sms < 100 || (says != 0) == can) ? 0 : 1,
                        1);
        }
    g_qx_wild = 0;
    loom_cuda_gemm_set_batch_invariant(g, 1);
    long s0 = lc_qgemv_split_count();
    test_qgemm(g, LOOM_CUDA_BF16, LOOM_CUDA_Q_INT8_W8A16, 1, 4096, 4096, 0, 0, true, false);
    report_bits("qgemv int8_w8a16 M=1 in batch-invariant mode: not split", lc_qgemv_split_count() == s0 ? 0 : 1, 1);
    loom_cuda_gemm_set_batch_invariant(g, 0);
    /* the launch does what loom_cuda_qgemm_splits says; on a GPU of 100
     * SMs or more (an H100 / H200 holds ~9 CTAs of it an SM) that is to
     * split the 8B O shape (512 CTAs) and not gate|up (3584) */
    const int auto_n[2] = {4096, 28672};
    for (int i = 0; i < 2; i++) {
        const loom_cuda_qweight probe = {.fmt = LOOM_CUDA_Q_INT8_W8A16, .N = auto_n[i], .K = 4096,
                                         .data = (void *)256, .scales = (float *)256};
        const int says = loom_cuda_qgemm_splits(g, LOOM_CUDA_BF16, &probe);
        s0 = lc_qgemv_split_count();
        test_qgemm(g, LOOM_CUDA_BF16, LOOM_CUDA_Q_INT8_W8A16, 1, auto_n[i], 4096, 0, 0, true, false);
        snprintf(name, sizeof name, "qgemv int8_w8a16 M=1 N=%d K=4096: ran split = loom_cuda_qgemm_splits (%d)",
                 auto_n[i], says);
        report_bits(name, (lc_qgemv_split_count() > s0) == (says != 0) ? 0 : 1, 1);
        if (sms >= 100) {
            snprintf(name, sizeof name, "qgemv int8_w8a16 M=1 N=%d K=4096 on %d SMs: %s", auto_n[i], sms,
                     i ? "whole (3584 CTAs fill the GPU)" : "split (512 CTAs do not)");
            report_bits(name, (says != 0) == (i == 0) ? 0 : 1, 1);
        }
    }
    loom_cuda_gemm_set_batch_invariant(g, 1);
    {
        const loom_cuda_qweight probe = {.fmt = LOOM_CUDA_Q_INT8_W8A16, .N = 4096, .K = 4096,
                                         .data = (void *)256, .scales = (float *)256};
        report_bits("loom_cuda_qgemm_splits: never in batch-invariant mode",
                    loom_cuda_qgemm_splits(g, LOOM_CUDA_BF16, &probe) ? 1 : 0, 1);
    }
    loom_cuda_gemm_set_batch_invariant(g, 0);
}

/* The FFN down projection with the SwiGLU formed inside the activation
 * quantization (loom_cuda_qgemm_swiglu_run; W8A8 / FP8) against
 * loom_cuda_swiglu then loom_cuda_qgemm_run: the same codes, so every output
 * bit must agree — on the GEMV (M <= 8) and the GEMM path, with a
 * SmoothQuant vector, a row wider than the kernel keeps in registers
 * (K = 65552: read twice), and W8A16 (which takes the two kernels). */
static void test_qgemm_swiglu(loom_cuda_gemm *g, loom_cuda_dt dt, loom_cuda_qfmt fmt, int M, int N,
                              int K, bool smooth) {
    uint8_t *data = malloc((size_t)N * K);
    float *sc = malloc((size_t)N * 4), *sm = malloc((size_t)K * 4);
    rand_q8_weight(fmt, N, K, data, sc);
    for (int k = 0; k < K; k++) sm[k] = gpu_rng_unif(0.5f, 2.0f);
    uint16_t *gu = rand16(dt, (size_t)M * 2 * K, -3, 3, NULL);
    void *d_data = dev_upload(data, (size_t)N * K), *d_sc = dev_upload(sc, (size_t)N * 4);
    void *d_sm = dev_upload(sm, (size_t)K * 4), *d_gu = dev_upload(gu, (size_t)M * 2 * K * 2);
    const loom_cuda_qweight w = {.fmt = fmt, .N = N, .K = K, .data = d_data, .scales = d_sc,
                                 .smooth = smooth ? d_sm : NULL};
    const size_t scr = loom_cuda_qgemm_scratch_bytes(g, dt, 0, &w, M);
    void *d_scr = dev_poison(scr), *d_act = dev_poison((size_t)M * K * 2), *d_y = dev_poison((size_t)M * N * 2);
    char *a = malloc((size_t)M * N * 2), *b = malloc((size_t)M * N * 2), msg[256] = "", name[160];
    int rc = 0;
    if (loom_cuda_swiglu(dt, d_act, d_gu, M, K, 0) != cudaSuccess) rc = 1, snprintf(msg, sizeof msg, "swiglu launch");
    if (!rc) rc = loom_cuda_qgemm_run(g, dt, 0, M, &w, d_act, d_y, d_scr, scr, 0, msg, sizeof msg);
    CK(cudaDeviceSynchronize());
    CK(cudaMemcpy(a, d_y, (size_t)M * N * 2, cudaMemcpyDeviceToHost));
    CK(cudaMemset(d_y, 0xff, (size_t)M * N * 2));
    CK(cudaMemset(d_act, 0xff, (size_t)M * K * 2)); /* the fused path must not need it */
    CK(cudaMemset(d_scr, 0xff, scr));               /* nor the codes the first path left */
    if (!rc) rc = loom_cuda_qgemm_swiglu_run(g, dt, M, &w, d_gu, fmt == LOOM_CUDA_Q_INT8_W8A16 ? d_act : NULL,
                                             d_y, d_scr, scr, 0, msg, sizeof msg);
    CK(cudaDeviceSynchronize());
    CK(cudaMemcpy(b, d_y, (size_t)M * N * 2, cudaMemcpyDeviceToHost));
    snprintf(name, sizeof name, "qgemm swiglu %s %s M=%d N=%d K=%d%s: fused bits = swiglu + qgemm bits",
             qfmt_name(fmt), dtn(dt), M, N, K, smooth ? " smooth" : "");
    if (rc) printf("      qgemm error: %s\n", msg);
    report_bits(name, rc ? 1 : bits_differ(a, b, (size_t)M * N, 2) + count_nan(dt, a, (size_t)M * N, 2), M);
    cudaFree(d_data), cudaFree(d_sc), cudaFree(d_sm), cudaFree(d_gu), cudaFree(d_scr), cudaFree(d_act), cudaFree(d_y);
    free(data), free(sc), free(sm), free(gu), free(a), free(b);
}

/* The QKV / gate|up projections with RMSNorm and the per-token
 * quantization in one kernel (loom_cuda_qgemm_norm_run; W8A8 / FP8) against
 * loom_cuda_add_rmsnorm then loom_cuda_qgemm_run: the same y bits and the
 * same advanced residual — with and without the residual add (layer 0),
 * with a SmoothQuant vector, f16, and W8A16 (which takes the two kernels). */
static void test_qgemm_norm(loom_cuda_gemm *g, loom_cuda_dt dt, loom_cuda_qfmt fmt, int M, int N, int K,
                            bool smooth, bool add) {
    uint8_t *data = malloc((size_t)N * K);
    float *sc = malloc((size_t)N * 4), *sm = malloc((size_t)K * 4), *nw = malloc((size_t)K * 4);
    float *x0 = malloc((size_t)M * K * 4);
    rand_q8_weight(fmt, N, K, data, sc);
    for (int k = 0; k < K; k++) sm[k] = gpu_rng_unif(0.5f, 2.0f), nw[k] = gpu_rng_unif(0.2f, 1.5f);
    for (size_t i = 0; i < (size_t)M * K; i++) x0[i] = gpu_rng_unif(-4.0f, 4.0f);
    uint16_t *r = rand16(dt, (size_t)M * K, -2, 2, NULL);
    void *d_data = dev_upload(data, (size_t)N * K), *d_sc = dev_upload(sc, (size_t)N * 4);
    void *d_sm = dev_upload(sm, (size_t)K * 4), *d_nw = dev_upload(nw, (size_t)K * 4);
    void *d_r = add ? dev_upload(r, (size_t)M * K * 2) : NULL;
    void *d_xa = dev_upload(x0, (size_t)M * K * 4), *d_xb = dev_upload(x0, (size_t)M * K * 4);
    const loom_cuda_qweight w = {.fmt = fmt, .N = N, .K = K, .data = d_data, .scales = d_sc,
                                 .smooth = smooth ? d_sm : NULL};
    const size_t scr = loom_cuda_qgemm_scratch_bytes(g, dt, 0, &w, M);
    void *d_scr = dev_poison(scr), *d_xn = dev_poison((size_t)M * K * 2), *d_y = dev_poison((size_t)M * N * 2);
    char *a = malloc((size_t)M * N * 2), *b = malloc((size_t)M * N * 2), msg[256] = "", name[160];
    float *xa = malloc((size_t)M * K * 4), *xb = malloc((size_t)M * K * 4);
    const float eps = 1e-5f;
    int rc = 0;
    if (loom_cuda_add_rmsnorm(dt, d_xn, d_xa, d_r, d_nw, NULL, M, K, eps, 0) != cudaSuccess)
        rc = 1, snprintf(msg, sizeof msg, "add_rmsnorm launch");
    if (!rc) rc = loom_cuda_qgemm_run(g, dt, 0, M, &w, d_xn, d_y, d_scr, scr, 0, msg, sizeof msg);
    CK(cudaDeviceSynchronize());
    CK(cudaMemcpy(a, d_y, (size_t)M * N * 2, cudaMemcpyDeviceToHost));
    CK(cudaMemset(d_y, 0xff, (size_t)M * N * 2));
    CK(cudaMemset(d_xn, 0xff, (size_t)M * K * 2)); /* the fused path must not need it */
    CK(cudaMemset(d_scr, 0xff, scr));              /* nor the codes the first path left */
    if (!rc) rc = loom_cuda_qgemm_norm_run(g, dt, M, &w, d_xb, d_r, d_nw, eps, d_xn, d_y, d_scr, scr, 0, msg,
                                           sizeof msg);
    CK(cudaDeviceSynchronize());
    CK(cudaMemcpy(b, d_y, (size_t)M * N * 2, cudaMemcpyDeviceToHost));
    CK(cudaMemcpy(xa, d_xa, (size_t)M * K * 4, cudaMemcpyDeviceToHost));
    CK(cudaMemcpy(xb, d_xb, (size_t)M * K * 4, cudaMemcpyDeviceToHost));
    snprintf(name, sizeof name, "qgemm norm %s %s M=%d N=%d K=%d%s%s: fused = add_rmsnorm + qgemm (y, x bits)",
             qfmt_name(fmt), dtn(dt), M, N, K, smooth ? " smooth" : "", add ? "" : " no-add");
    if (rc) printf("      qgemm error: %s\n", msg);
    report_bits(name, rc ? 1 : bits_differ(a, b, (size_t)M * N, 2) + count_nan(dt, a, (size_t)M * N, 2) +
                                    bits_differ(xa, xb, (size_t)M * K, 4), M);
    cudaFree(d_data), cudaFree(d_sc), cudaFree(d_sm), cudaFree(d_nw), cudaFree(d_r), cudaFree(d_xa);
    cudaFree(d_xb), cudaFree(d_scr), cudaFree(d_xn), cudaFree(d_y);
    free(data), free(sc), free(sm), free(nw), free(x0), free(r), free(a), free(b), free(xa), free(xb);
}

/* Every format over decode and prefill shapes, both paths at the boundary
 * sizes, odd N, K not a multiple of 128, both element types. */
static void test_qgemm_all(loom_cuda_gemm *g) {
    const loom_cuda_qfmt fmts[4] = {LOOM_CUDA_Q_INT8_W8A16, LOOM_CUDA_Q_INT8_W8A8, LOOM_CUDA_Q_FP8,
                                    LOOM_CUDA_Q_INT4};
    const int Ms[7] = {1, 2, 7, 8, 9, 64, 300};
    for (int fi = 0; fi < 4; fi++) {
        const loom_cuda_qfmt f = fmts[fi];
        const bool i4 = f == LOOM_CUDA_Q_INT4;
        /* default dispatch over M, an odd N, K = 576 (SmolLM2: not a multiple of 128) */
        for (int mi = 0; mi < 7; mi++)
            test_qgemm(g, LOOM_CUDA_BF16, f, Ms[mi], 1001, 576, i4 ? 64 : 0, 0, false, false);
        /* both paths forced at the boundaries */
        const int Mb[5] = {1, 7, 8, 9, 64};
        const int Kb = i4 ? 1152 : 1040; /* int4: 9 groups of 128; else 65 x 16 */
        for (int mi = 0; mi < 5; mi++) {
            test_qgemm(g, LOOM_CUDA_BF16, f, Mb[mi], 768, Kb, i4 ? 128 : 0, 1, false, false);
            test_qgemm(g, LOOM_CUDA_BF16, f, Mb[mi], 768, Kb, i4 ? 128 : 0, 2, false, false);
        }
        test_qgemm(g, LOOM_CUDA_BF16, f, 300, 515, 576, i4 ? 32 : 0, 1, false, false);
        test_qgemm(g, LOOM_CUDA_BF16, f, 300, 512, 4096, i4 ? 128 : 0, 2, false, false);
        /* Llama-3-8B shapes at decode */
        test_qgemm(g, LOOM_CUDA_BF16, f, 1, 4096, 14336, i4 ? 128 : 0, 0, false, false);
        test_qgemm(g, LOOM_CUDA_BF16, f, 4, 6144, 4096, i4 ? 128 : 0, 0, false, false);
        /* f16, float32 output (LM head), odd N with the GEMM path */
        test_qgemm(g, LOOM_CUDA_F16, f, 3, 999, 576, i4 ? 32 : 0, 0, false, false);
        test_qgemm(g, LOOM_CUDA_F16, f, 64, 999, 576, i4 ? 32 : 0, 2, false, false);
        test_qgemm(g, LOOM_CUDA_BF16, f, 2, 4097, 576, i4 ? 64 : 0, 0, true, false);
        test_qgemm(g, LOOM_CUDA_BF16, f, 40, 4097, 576, i4 ? 64 : 0, 2, true, false);
        test_qgemm(g, LOOM_CUDA_F16, f, 9, 1001, 576, i4 ? 64 : 0, 2, true, false);
    }
    /* the tensor-core GEMV's edges (W8A8 / FP8 / INT4 at 2..8 rows): int4
     * groups of 256, M = 3..6 at an N that is not a multiple of its 16-row
     * tiles with a partial last phase of 1024 columns, f16 with f32 output;
     * then Llama-3-8B decode shapes at M = 2 and 4 on the CUDA-core GEMV (the
     * kernel of M = 1, of W8A16, of batch-invariant mode and of the shapes
     * the tensor-core one does not take) */
    for (int fi = 0; fi < 4; fi++) {
        const loom_cuda_qfmt f = fmts[fi];
        const bool i4 = f == LOOM_CUDA_Q_INT4;
        if (i4) test_qgemm(g, LOOM_CUDA_BF16, f, 3, 515, 2048, 256, 0, false, false);
        for (int m = 3; m <= 6; m++)
            test_qgemm(g, LOOM_CUDA_BF16, f, m, 1009, i4 ? 1408 : 1216, i4 ? 128 : 0, 1, false, false);
        test_qgemm(g, LOOM_CUDA_F16, f, 5, 777, 2048, i4 ? 128 : 0, 0, true, false);
        /* three phases with a partial last one; N below one 16-row tile;
         * bf16 with f32 output; the 8B down projection; tokens of wild
         * magnitudes (f16's range exceeded, 1e-6, powers of two) */
        test_qgemm(g, LOOM_CUDA_BF16, f, 4, 300, 2560, i4 ? 128 : 0, 0, false, false);
        test_qgemm(g, LOOM_CUDA_BF16, f, 3, 7, i4 ? 1152 : 1024, i4 ? 128 : 0, 0, false, false);
        test_qgemm(g, LOOM_CUDA_BF16, f, 6, 515, 2048, i4 ? 128 : 0, 0, true, false);
        test_qgemm(g, LOOM_CUDA_BF16, f, 3, 4096, 14336, i4 ? 128 : 0, 0, false, false);
        /* one row with float32 output (held to 1e-4: INT4's offset decode
         * must stay that close) and an odd N (a partial last CTA of 16
         * INT4 rows) */
        test_qgemm(g, LOOM_CUDA_BF16, f, 1, 515, 2048, i4 ? 128 : 0, 1, true, false);
        g_qx_wild = true;
        test_qgemm(g, LOOM_CUDA_BF16, f, 1, 515, 2048, i4 ? 128 : 0, 1, true, false);
        test_qgemm(g, LOOM_CUDA_BF16, f, 8, 515, 2048, i4 ? 128 : 0, 0, false, false);
        test_qgemm(g, LOOM_CUDA_F16, f, 7, 515, 1024, i4 ? 128 : 0, 0, true, false);
        g_qx_wild = false;
        loom_cuda_qgemm_set_tc_min_m(g, 9); /* the CUDA-core kernel at every M */
        test_qgemm(g, LOOM_CUDA_BF16, f, 2, 4096, 14336, i4 ? 128 : 0, 0, false, false);
        test_qgemm(g, LOOM_CUDA_BF16, f, 4, 6144, 4096, i4 ? 128 : 0, 0, false, false);
        loom_cuda_qgemm_set_tc_min_m(g, 0);
    }
    /* the FP8 GEMM path both ways at every M: cuBLASLt's outer scale
     * vectors (the default from LOOM_CUDA_FP8_VEC_MIN_M rows where it has
     * an algorithm, for bf16 output; here from 0, which qgemm_defaults
     * leaves alone) and unit scales + the epilogue pass — bf16, f16 and f32
     * outputs, a Llama-3-8B prefill shape */
    for (int vec = 1; vec >= 0; vec--) {
        const int prev = lc_gemm_fp8_vec(g);
        lc_gemm_set_fp8_vec(g, vec);
        loom_cuda_qgemm_set_fp8_vec_min_m(g, 0);
        test_qgemm(g, LOOM_CUDA_BF16, LOOM_CUDA_Q_FP8, 300, 512, 4096, 0, 2, false, false);
        test_qgemm(g, LOOM_CUDA_F16, LOOM_CUDA_Q_FP8, 64, 1000, 576, 0, 2, false, false);
        test_qgemm(g, LOOM_CUDA_BF16, LOOM_CUDA_Q_FP8, 40, 4097, 576, 0, 2, true, false);
        long v0, e0, v1, e1;
        lc_qgemm_fp8_count(&v0, &e0);
        test_qgemm(g, LOOM_CUDA_BF16, LOOM_CUDA_Q_FP8, 130, 6144, 4096, 0, 0, false, false);
        lc_qgemm_fp8_count(&v1, &e1);
        /* on sm_90 with cuBLAS >= 12.9 the 8B shape must take the path asked for */
        report_bits(vec ? "fp8 GEMM M=130 N=6144 K=4096 ran with cuBLASLt's scale vectors"
                        : "fp8 GEMM M=130 N=6144 K=4096 ran with unit scales + epilogue",
                    vec ? (v1 == v0 + 1 && e1 == e0 ? 0 : 1) : (e1 == e0 + 1 && v1 == v0 ? 0 : 1), 1);
        g_qx_wild = true;
        test_qgemm(g, LOOM_CUDA_BF16, LOOM_CUDA_Q_FP8, 64, 515, 2048, 0, 2, false, false);
        g_qx_wild = false;
        lc_gemm_set_fp8_vec(g, prev);
        loom_cuda_qgemm_set_fp8_vec_min_m(g, LOOM_CUDA_FP8_VEC_MIN_M);
    }
    /* as dispatched: unit scales + the epilogue below LOOM_CUDA_FP8_VEC_MIN_M
     * rows, the scale vectors from there (the 8B shape has both on sm_90) */
    for (int k = 0; k < 2; k++) {
        const int M = k ? LOOM_CUDA_FP8_VEC_MIN_M : LOOM_CUDA_FP8_VEC_MIN_M - 1;
        long v0, e0, v1, e1;
        lc_qgemm_fp8_count(&v0, &e0);
        test_qgemm(g, LOOM_CUDA_BF16, LOOM_CUDA_Q_FP8, M, 6144, 4096, 0, 0, false, false);
        lc_qgemm_fp8_count(&v1, &e1);
        char nm[96];
        snprintf(nm, sizeof nm, "fp8 GEMM M=%d N=6144 K=4096 as dispatched: %s", M,
                 k ? "cuBLASLt's scale vectors" : "unit scales + epilogue");
        report_bits(nm, k ? (v1 == v0 + 1 && e1 == e0 ? 0 : 1) : (e1 == e0 + 1 && v1 == v0 ? 0 : 1), 1);
    }
    /* SwiGLU inside the activation quantization (the FFN down projection) */
    const int Msw[4] = {1, 5, 64, 300};
    for (int mi = 0; mi < 4; mi++) {
        test_qgemm_swiglu(g, LOOM_CUDA_BF16, LOOM_CUDA_Q_FP8, Msw[mi], 1000, 1536, false);
        test_qgemm_swiglu(g, LOOM_CUDA_BF16, LOOM_CUDA_Q_INT8_W8A8, Msw[mi], 1000, 1536, false);
    }
    test_qgemm_swiglu(g, LOOM_CUDA_F16, LOOM_CUDA_Q_FP8, 3, 515, 14336, false);
    test_qgemm_swiglu(g, LOOM_CUDA_BF16, LOOM_CUDA_Q_INT8_W8A8, 64, 512, 14336, true);
    test_qgemm_swiglu(g, LOOM_CUDA_BF16, LOOM_CUDA_Q_FP8, 2, 64, 65552, false);
    test_qgemm_swiglu(g, LOOM_CUDA_BF16, LOOM_CUDA_Q_INT8_W8A8, 1, 64, 65552, true);
    test_qgemm_swiglu(g, LOOM_CUDA_BF16, LOOM_CUDA_Q_INT8_W8A16, 5, 1000, 1536, false);
    test_qgemm_swiglu(g, LOOM_CUDA_BF16, LOOM_CUDA_Q_FP8, 300, 512, 4096, true);
    test_qgemm_swiglu(g, LOOM_CUDA_BF16, LOOM_CUDA_Q_FP8, 2085, 64, 256, false); /* 2 chunks of rows */
    /* RMSNorm + the quantization in one kernel (the QKV / gate|up input) */
    for (int mi = 0; mi < 4; mi++) {
        test_qgemm_norm(g, LOOM_CUDA_BF16, LOOM_CUDA_Q_FP8, Msw[mi], 1000, 4096, false, true);
        test_qgemm_norm(g, LOOM_CUDA_BF16, LOOM_CUDA_Q_INT8_W8A8, Msw[mi], 1000, 4096, false, true);
    }
    test_qgemm_norm(g, LOOM_CUDA_BF16, LOOM_CUDA_Q_FP8, 3, 515, 576, false, false);
    test_qgemm_norm(g, LOOM_CUDA_F16, LOOM_CUDA_Q_FP8, 9, 515, 8192, false, true);
    test_qgemm_norm(g, LOOM_CUDA_BF16, LOOM_CUDA_Q_INT8_W8A8, 64, 512, 4096, true, true);
    test_qgemm_norm(g, LOOM_CUDA_BF16, LOOM_CUDA_Q_INT8_W8A16, 5, 1000, 4096, false, true);
    test_qgemm_norm(g, LOOM_CUDA_BF16, LOOM_CUDA_Q_FP8, 300, 512, 4096, true, true);
    test_qgemm_norm(g, LOOM_CUDA_BF16, LOOM_CUDA_Q_INT8_W8A8, 2085, 64, 256, false, true); /* 2 chunks */
    test_qgemm_norm(g, LOOM_CUDA_BF16, LOOM_CUDA_Q_FP8, 2085, 64, 256, false, false);
    /* W8A8 sums int32 exactly on both GEMVs: the same bits */
    test_qgemm_tc_bits(g, LOOM_CUDA_BF16, 1001, 2048, false);
    test_qgemm_tc_bits(g, LOOM_CUDA_F16, 300, 1024, true);
    test_qgemm_tc_min_m(g);
    /* W8A8 with a SmoothQuant vector, both paths */
    test_qgemm(g, LOOM_CUDA_BF16, LOOM_CUDA_Q_INT8_W8A8, 3, 1000, 1024, 0, 0, false, true);
    test_qgemm(g, LOOM_CUDA_BF16, LOOM_CUDA_Q_INT8_W8A8, 64, 1000, 1024, 0, 2, false, true);
}

/* Batch-invariant quantized linear layer: loom_cuda_qgemm_run's rows at
 * M = 1 (one call per row) vs M = 5, 13 and Mmax, bit for bit — in
 * invariant mode every M runs the fused GEMV in passes of 8 rows (W8A8 /
 * FP8 quantize each token's activations alone). Random codes and scales:
 * the arithmetic is test_qgemm's business. The ordinary dispatch at Mmax
 * (the GEMM path above the format's GEMV bound) is reported as INFO. */
/* W8A16 / INT4 above the GEMV's rows: qmma.cu's tensor-core kernel against
 * the float64 reference — token tiles of 16 / 32 / 64 and partial ones, M
 * past one tile (grid y), row counts that leave a partial 64-row tile,
 * matrices split over K (N = 4096: five slices, the reduce kernel) and not
 * (N = 16896: 264 row tiles), INT4 groups of 256, 512 and K, f16 with float32 output held to 1e-4, tokens of wild
 * magnitudes. (The dequantize + GEMM path it replaced at these rows still
 * serves the shapes it does not take and more rows: test_qgemm_all's path 2
 * and M = 300 calls.) */
static void test_qgemm_qmma(loom_cuda_gemm *g) {
    const loom_cuda_qfmt fmts[2] = {LOOM_CUDA_Q_INT8_W8A16, LOOM_CUDA_Q_INT4};
    for (int fi = 0; fi < 2; fi++) {
        const loom_cuda_qfmt f = fmts[fi];
        const bool i4 = f == LOOM_CUDA_Q_INT4;
        const int Ms[8] = {40, 64, 65, 128, 100, 9, 17, 33};
        for (int mi = 0; mi < 8; mi++)
            test_qgemm(g, LOOM_CUDA_BF16, f, Ms[mi], 1001, 1024, i4 ? 128 : 0, 0, false, false);
        test_qgemm(g, LOOM_CUDA_BF16, f, 64, 4096, 4096, i4 ? 128 : 0, 0, false, false);
        test_qgemm(g, LOOM_CUDA_BF16, f, 48, 16896, 512, i4 ? 256 : 0, 0, false, false);
        test_qgemm(g, LOOM_CUDA_F16, f, 70, 515, 1536, i4 ? 128 : 0, 0, true, false);
        test_qgemm(g, LOOM_CUDA_BF16, f, 20, 515, 14336, i4 ? 128 : 0, 2, true, false);
        if (i4) { /* a group over several k-steps; one group a row */
            test_qgemm(g, LOOM_CUDA_BF16, f, 48, 515, 2048, 512, 0, true, false);
            test_qgemm(g, LOOM_CUDA_BF16, f, 24, 300, 1024, 1024, 0, false, false);
        }
        g_qx_wild = true;
        test_qgemm(g, LOOM_CUDA_BF16, f, 37, 300, 2048, i4 ? 128 : 0, 0, true, false);
        test_qgemm(g, LOOM_CUDA_F16, f, 37, 300, 2048, i4 ? 128 : 0, 0, true, false);
        test_qgemm(g, LOOM_CUDA_BF16, f, 12, 300, 2048, i4 ? 128 : 0, 0, false, false);
        g_qx_wild = false;
    }
}

/* W8A16 / INT4 on weights repacked into the tiled layout (qtiled.cu)
 * against the float64 reference: every row count that picks another token
 * tile or leaves a partial one (1..256; from 17 rows the wgmma path, the
 * 32 / 64 / 128 / 256-token tiles and their edges, with the copies the
 * dispatch picks and again with cp.async, TMA and the wide TMA kernel
 * forced; a few once
 * more on the mma.sync path with the wgmma bound off), N of an odd number
 * of 16-row tiles
 * (a partial 128-row CTA block) and wide N (no K split), K split into
 * slices (N small), INT4 groups of 64 (two a stage), 128, 256 and K, both
 * dts, f32 output, tokens of wild magnitudes; above the tiled bound the
 * tiled dequantize + cuBLASLt; batch-invariant bits. */
static void test_qgemm_invariance(loom_cuda_gemm *g, loom_cuda_dt dt, loom_cuda_qfmt fmt, int N, int K,
                                  int group, bool out_f32, int Mmax);
/* Tiled f at each of the n row counts Ms: a bf16 weight of 592 x 1024 (two
 * full 128-row blocks and a partial one), an f16 one of 208 x 2048 (f32
 * output at odd M); INT4 groups of 128 / 64. */
static void tiled_at_rows(loom_cuda_gemm *g, loom_cuda_qfmt f, const int *Ms, int n) {
    const bool i4 = f == LOOM_CUDA_Q_INT4;
    for (int mi = 0; mi < n; mi++) {
        test_qgemm(g, LOOM_CUDA_BF16, f, Ms[mi], 592, 1024, i4 ? 128 : 0, 0, false, false);
        test_qgemm(g, LOOM_CUDA_F16, f, Ms[mi], 208, 2048, i4 ? 64 : 0, 0, Ms[mi] % 2 == 1, false);
    }
}

/* d rounded once to dt: to float by round-to-odd (toward zero, last bit
 * set), whose 13+ extra bits leave to16's rounding the only one */
static uint16_t to16_once(loom_cuda_dt dt, double d) {
    float f = (float)d;
    if ((double)f != d) {
        if (fabs((double)f) > fabs(d)) f = nextafterf(f, 0.0f);
        uint32_t u;
        memcpy(&u, &f, 4);
        u |= 1u;
        memcpy(&f, &u, 4);
    }
    return to16(dt, f);
}

/* lc_qtiled_dequant (the tiled path above its bound) against the host's
 * decode of the same codes, every bit: INT4 (q - 8) s + b' rounded once to
 * dt from the tile pairs (s and b' = b + 8 s rounded to dt, as
 * loom_cuda_qweight_tile writes them), int8 q s in fp32 rounded to dt.
 * Random codes and scales, zero groups and rows among them. */
static void test_qtiled_dequant(loom_cuda_dt dt, loom_cuda_qfmt fmt, int N, int K, int group) {
    const bool i4 = fmt == LOOM_CUDA_Q_INT4;
    const int ng = i4 ? K / group : 1;
    const size_t data_bytes = i4 ? (size_t)N * K / 2 : (size_t)N * K, ns = (size_t)N * (i4 ? 2 * ng : 1);
    uint8_t *data = malloc(data_bytes);
    float *scales = malloc(ns * 4);
    for (size_t i = 0; i < data_bytes; i++) data[i] = (uint8_t)rng_int(256);
    for (size_t i = 0; i < ns; i++) scales[i] = rng_int(16) == 0 ? 0.0f : gpu_rng_unif(-0.05f, 0.05f);
    uint16_t *ref = malloc((size_t)N * K * 2), *out = malloc((size_t)N * K * 2);
    for (int n = 0; n < N; n++)
        for (int k = 0; k < K; k++) {
            if (i4) {
                const int q = (data[(size_t)n * (K / 2) + k / 2] >> (k % 2 * 4)) & 15;
                const float sv = scales[((size_t)n * ng + k / group) * 2], bv = scales[((size_t)n * ng + k / group) * 2 + 1];
                const double s16 = from16(dt, to16(dt, sv)), b16 = from16(dt, to16(dt, fmaf(8.0f, sv, bv)));
                ref[(size_t)n * K + k] = to16_once(dt, (double)(q - 8) * s16 + b16);
            } else {
                ref[(size_t)n * K + k] = to16(dt, (float)(int8_t)data[(size_t)n * K + k] * scales[n]);
            }
        }
    loom_cuda_qweight w = {.fmt = fmt, .N = N, .K = K, .group = i4 ? group : 0,
                           .data = dev_upload(data, data_bytes), .scales = dev_upload(scales, ns * 4)};
    void *d_out = dev_poison((size_t)N * K * 2);
    const cudaError_t e1 = loom_cuda_qweight_tile(&w, dt, 0);
    const cudaError_t e2 = e1 == cudaSuccess ? lc_qtiled_dequant(dt, &w, d_out, 0) : e1;
    CK(cudaDeviceSynchronize());
    long bad = e2 == cudaSuccess ? 0 : (long)N * K;
    if (e2 == cudaSuccess) {
        CK(cudaMemcpy(out, d_out, (size_t)N * K * 2, cudaMemcpyDeviceToHost));
        for (size_t i = 0; i < (size_t)N * K; i++) bad += out[i] != ref[i];
    } else {
        printf("      %s\n", cudaGetErrorString(e2));
    }
    char name[128], gs[16] = "";
    if (i4) snprintf(gs, sizeof gs, " g%d", group);
    snprintf(name, sizeof name, "tiled dequantize %s %s N=%d K=%d%s: elements off by a bit", qfmt_name(fmt),
             dtn(dt), N, K, gs);
    report_count(name, bad, (long)N * K);
    cudaFree((void *)w.data), cudaFree((void *)w.scales), cudaFree(d_out);
    free(data), free(scales), free(ref), free(out);
}

static void test_qgemm_tiled(loom_cuda_gemm *g) {
    const loom_cuda_qfmt fmts[2] = {LOOM_CUDA_Q_INT8_W8A16, LOOM_CUDA_Q_INT4};
    enum { NM = 20 };
    const int Ms[NM] = {1, 2, 3, 8, 9, 16, 17, 31, 33, 63, 64, 65, 100, 127, 128, 129, 200, 255, 256, 248};
    g_q_tile = true;
    loom_cuda_qgemm_set_tiled_max_m(g, 256); /* the kernel, one chunk, at every M below */
    for (int fi = 0; fi < 2; fi++) {
        const loom_cuda_qfmt f = fmts[fi];
        const bool i4 = f == LOOM_CUDA_Q_INT4;
        const long wg0 = lc_qtiled_wgmma_count();
        tiled_at_rows(g, f, Ms, NM);
        /* the wgmma path: wide N (one K slice), K split over many slices,
         * groups ending mid-stage (192), f32 output; then the mma.sync path
         * at the same rows (wgmma bound off) */
        test_qgemm(g, LOOM_CUDA_BF16, f, 200, 4096, 4096, i4 ? 128 : 0, 0, false, false);
        test_qgemm(g, LOOM_CUDA_F16, f, 100, 2048, 4096, i4 ? 128 : 0, 0, true, false);
        test_qgemm(g, LOOM_CUDA_BF16, f, 40, 48, 14336, i4 ? 128 : 0, 0, true, false);
        test_qgemm(g, LOOM_CUDA_BF16, f, 150, 304, 1536, i4 ? 192 : 0, 0, false, false);
        test_qgemm(g, LOOM_CUDA_F16, f, 77, 304, 1536, i4 ? 192 : 0, 0, true, false);
        test_qgemm(g, LOOM_CUDA_BF16, f, 256, 16896, 512, i4 ? 256 : 0, 0, true, false);
        /* and the dispatch took it: the 14 rows >= 17 above, twice; these 6 */
        report_count(i4 ? "tiled int4: calls missing the wgmma path from 17 rows"
                        : "tiled w8a16: calls missing the wgmma path from 17 rows",
                     labs(2 * 14 + 6 - (lc_qtiled_wgmma_count() - wg0)), 2 * 14 + 6);
        /* the default's kernel by format and rows (qtiled.cu): INT4 from 64
         * rows the wide TMA kernel — groups of 512 and of all K too — never
         * its cp.async fallback; W8A16 never the wide kernel */
        {
            const long wide0 = lc_qtiled_wide_count(), fb0d = lc_qtiled_tma_fallback_count();
            test_qgemm(g, LOOM_CUDA_BF16, f, 64, 592, 2048, i4 ? 512 : 0, 0, false, false);
            test_qgemm(g, LOOM_CUDA_F16, f, 130, 304, 1024, i4 ? 1024 : 0, 0, true, false);
            test_qgemm(g, LOOM_CUDA_BF16, f, 256, 208, 4096, i4 ? 128 : 0, 0, false, false);
            const long wide = lc_qtiled_wide_count() - wide0;
            report_count(i4 ? "tiled int4: default calls from 64 rows not on the wide TMA kernel"
                            : "tiled w8a16: default calls on the wide TMA kernel",
                         i4 ? labs(3 - wide) : wide, 3);
            report_count(i4 ? "tiled int4: default calls that fell back to cp.async"
                            : "tiled w8a16: default calls that fell back to cp.async",
                         lc_qtiled_tma_fallback_count() - fb0d, 3);
        }
        /* the wgmma path with each of its kernels forced (the default picks
         * by format and M): cp.async copies, TMA copies, the wide TMA kernel
         * (256-row CTAs: 592 rows are two full blocks and a partial one, 208
         * a partial one, each K split; K split over 8 slices at 48 rows; no
         * split at 16896 rows: 66 row blocks x 2 token tiles) — none of them
         * may fall back to cp.async for want of a tensor map */
        const int modes[3] = {0, 1, 4};
        const long fbm = lc_qtiled_tma_fallback_count(), wgm = lc_qtiled_wgmma_count();
        for (int mo = 0; mo < 3; mo++) {
            lc_qtiled_set_wgmma_tma(modes[mo]);
            const int Mc[7] = {17, 63, 65, 128, 129, 200, 256};
            tiled_at_rows(g, f, Mc, 7);
            test_qgemm(g, LOOM_CUDA_BF16, f, 150, 304, 1536, i4 ? 192 : 0, 0, false, false);
            test_qgemm(g, LOOM_CUDA_BF16, f, 256, 4096, 4096, i4 ? 128 : 0, 0, true, false);
            test_qgemm(g, LOOM_CUDA_F16, f, 40, 48, 14336, i4 ? 128 : 0, 0, true, false);
            test_qgemm(g, LOOM_CUDA_BF16, f, 256, 16896, 512, i4 ? 256 : 0, 0, false, false);
            test_qgemm(g, LOOM_CUDA_F16, f, 200, 16896, 512, i4 ? 128 : 0, 0, true, false);
        }
        report_count(i4 ? "tiled int4: forced wgmma kernels that fell back to cp.async"
                        : "tiled w8a16: forced wgmma kernels that fell back to cp.async",
                     lc_qtiled_tma_fallback_count() - fbm, lc_qtiled_wgmma_count() - wgm);
        /* TMA without a tensor map: the cp.async kernel instead */
        lc_qtiled_set_wgmma_tma(3);
        const long fb0 = lc_qtiled_tma_fallback_count();
        test_qgemm(g, LOOM_CUDA_BF16, f, 65, 592, 1024, i4 ? 128 : 0, 0, false, false);
        test_qgemm(g, LOOM_CUDA_F16, f, 200, 208, 2048, i4 ? 64 : 0, 0, true, false);
        report_count(i4 ? "tiled int4: TMA calls without a tensor map not falling back"
                        : "tiled w8a16: TMA calls without a tensor map not falling back",
                     labs(2 - (lc_qtiled_tma_fallback_count() - fb0)), 2);
        lc_qtiled_set_wgmma_tma(2);
        loom_cuda_qgemm_set_tiled_wgmma_min_m(g, 0);
        test_qgemm(g, LOOM_CUDA_BF16, f, 64, 592, 1024, i4 ? 128 : 0, 0, false, false);
        test_qgemm(g, LOOM_CUDA_F16, f, 200, 208, 2048, i4 ? 64 : 0, 0, true, false);
        loom_cuda_qgemm_set_tiled_wgmma_min_m(g, LC_QT_DEFAULT_WG_MIN_M);
        test_qgemm(g, LOOM_CUDA_BF16, f, 1, 4096, 4096, i4 ? 128 : 0, 0, true, false);
        /* one row on qtiled.cu's mma.sync path (INT4: the raw decode), once
         * a call (lc_qtiled): partial 128-row blocks (592, 304, 48 rows), K split
         * into slices (up to 8: K = 4224 in 33 stages, K = 14336) whose
         * edges fall mid-group (groups of 192), one group of all K, no
         * split (16896 rows), QKV's shape, f32 output */
        {
            static const struct { loom_cuda_dt dt; int N, K, group; bool f32; } one[] = {
                {LOOM_CUDA_BF16, 592, 1536, 192, false}, {LOOM_CUDA_F16, 592, 2048, 64, false},
                {LOOM_CUDA_F16, 48, 14336, 128, true},   {LOOM_CUDA_BF16, 304, 1024, 1024, false},
                {LOOM_CUDA_F16, 16896, 512, 64, true},   {LOOM_CUDA_BF16, 6144, 4096, 128, false},
                {LOOM_CUDA_BF16, 48, 4224, 192, true},
            };
            const long n1 = (long)(sizeof one / sizeof one[0]);
            const long t0 = lc_qgemm_qtiled_count(), wg0 = lc_qtiled_wgmma_count();
            for (long i = 0; i < n1; i++)
                test_qgemm(g, one[i].dt, f, 1, one[i].N, one[i].K, i4 ? one[i].group : 0, 0, one[i].f32, false);
            report_count(i4 ? "tiled int4: one-row calls not run once on qtiled.cu's mma.sync path"
                            : "tiled w8a16: one-row calls not run once on qtiled.cu's mma.sync path",
                         labs(n1 - (lc_qgemm_qtiled_count() - t0)) + (lc_qtiled_wgmma_count() - wg0), n1);
        }
        test_qgemm(g, LOOM_CUDA_BF16, f, 64, 4096, 4096, i4 ? 128 : 0, 0, false, false);
        test_qgemm(g, LOOM_CUDA_BF16, f, 24, 16896, 512, i4 ? 256 : 0, 0, false, false);
        test_qgemm(g, LOOM_CUDA_BF16, f, 5, 48, 14336, i4 ? 128 : 0, 0, true, false);
        if (i4) {
            test_qgemm(g, LOOM_CUDA_BF16, f, 48, 528, 2048, 512, 0, true, false);
            test_qgemm(g, LOOM_CUDA_F16, f, 7, 304, 1024, 1024, 0, false, false);
            test_qgemm(g, LOOM_CUDA_BF16, f, 33, 304, 1536, 192, 0, false, false);
            /* the raw decode (<= 16 tokens): groups ending mid-stage, slices
             * starting and ending mid-group */
            test_qgemm(g, LOOM_CUDA_BF16, f, 5, 304, 1536, 192, 0, true, false);
            test_qgemm(g, LOOM_CUDA_F16, f, 12, 304, 1536, 192, 0, false, false);
        }
        g_qx_wild = true;
        test_qgemm(g, LOOM_CUDA_BF16, f, 37, 304, 2048, i4 ? 128 : 0, 0, true, false);
        test_qgemm(g, LOOM_CUDA_F16, f, 1, 304, 2048, i4 ? 128 : 0, 0, true, false);
        g_qx_wild = false;
        /* above the tiled bound: the tiled weight dequantized + cuBLASLt */
        test_qtiled_dequant(LOOM_CUDA_BF16, f, 592, 1024, i4 ? 128 : 0);
        test_qtiled_dequant(LOOM_CUDA_F16, f, 208, 2048, i4 ? 64 : 0);
        test_qtiled_dequant(LOOM_CUDA_BF16, f, 48, 1536, i4 ? 1536 : 0);
        test_qtiled_dequant(LOOM_CUDA_BF16, f, 4096, 4608, i4 ? 192 : 0);
        test_qtiled_dequant(LOOM_CUDA_F16, f, 16, 384, i4 ? 128 : 0); /* fewer tiles than one CTA's warps */
        loom_cuda_qgemm_set_tiled_max_m(g, 16);
        test_qgemm(g, LOOM_CUDA_BF16, f, 40, 592, 1024, i4 ? 128 : 0, 0, false, false);
        test_qgemm(g, LOOM_CUDA_F16, f, 300, 208, 1024, i4 ? 64 : 0, 0, true, false);
        /* a bound above 256: the kernel in chunks of 256 rows (a last chunk
         * of 1 and of 14 rows on the mma.sync path, of 44 and 232 on wgmma,
         * and whole chunks only), one kernel launch per chunk */
        loom_cuda_qgemm_set_tiled_max_m(g, 1024);
        const long ch0 = lc_qgemm_qtiled_count();
        test_qgemm(g, LOOM_CUDA_BF16, f, 257, 592, 1024, i4 ? 128 : 0, 0, true, false);
        test_qgemm(g, LOOM_CUDA_F16, f, 270, 208, 2048, i4 ? 64 : 0, 0, false, false);
        test_qgemm(g, LOOM_CUDA_BF16, f, 300, 592, 1024, i4 ? 128 : 0, 0, false, false);
        test_qgemm(g, LOOM_CUDA_F16, f, 512, 208, 2048, i4 ? 64 : 0, 0, true, false);
        test_qgemm(g, LOOM_CUDA_BF16, f, 1000, 304, 1536, i4 ? 192 : 0, 0, false, false);
        report_count(i4 ? "tiled int4: chunk runs above 256 rows (257, 270, 300, 512, 1000 rows: 2+2+2+2+4) off"
                        : "tiled w8a16: chunk runs above 256 rows (257, 270, 300, 512, 1000 rows: 2+2+2+2+4) off",
                     labs(12 - (lc_qgemm_qtiled_count() - ch0)), 12);
        const long ch1 = lc_qgemm_qtiled_count(); /* above the bound: dequantized, no kernel run */
        test_qgemm(g, LOOM_CUDA_BF16, f, 1100, 208, 1024, i4 ? 128 : 0, 0, false, false);
        report_count(i4 ? "tiled int4: kernel runs at 1100 rows above a bound of 1024"
                        : "tiled w8a16: kernel runs at 1100 rows above a bound of 1024",
                     lc_qgemm_qtiled_count() - ch1, 1);
        loom_cuda_qgemm_set_tiled_max_m(g, 256);
        test_qgemm_invariance(g, LOOM_CUDA_BF16, f, 1008, 1024, 128, false, 40);
        test_qgemm_invariance(g, LOOM_CUDA_F16, f, 512, 1024, 64, true, 19);
    }
    g_q_tile = false;
    loom_cuda_qgemm_set_tiled_max_m(g, LC_QT_DEFAULT_MAX_M);
}

/* The scratch bytes returned for max_m must serve every M <= max_m, also
 * when the GEMV's bound is set below 8 (then 5..8 rows dequantize, which
 * qmma.cu's buffers alone would not hold): sized at 64, called at 6, 40
 * and 64 with the bound at 4 — each call must run and write finite rows. */
static void test_qgemm_scratch_bound(loom_cuda_gemm *g) {
    const loom_cuda_qfmt fmts[2] = {LOOM_CUDA_Q_INT8_W8A16, LOOM_CUDA_Q_INT4};
    const int N = 300, K = 1024, Ms[3] = {6, 40, 64};
    for (int fi = 0; fi < 2; fi++) {
        const bool i4 = fmts[fi] == LOOM_CUDA_Q_INT4;
        const size_t db = i4 ? (size_t)N * K / 2 : (size_t)N * K, ns = i4 ? (size_t)N * (K / 128) * 2 : N;
        uint8_t *data = malloc(db);
        float *sc = malloc(ns * 4);
        for (size_t i = 0; i < db; i++) data[i] = (uint8_t)rng_int(256);
        for (size_t i = 0; i < ns; i++) sc[i] = gpu_rng_unif(-0.01f, 0.01f);
        uint16_t *x = rand16(LOOM_CUDA_BF16, (size_t)64 * K, -2, 2, NULL);
        void *d_data = dev_upload(data, db), *d_sc = dev_upload(sc, ns * 4), *d_x = dev_upload(x, (size_t)64 * K * 2);
        const loom_cuda_qweight w = {.fmt = fmts[fi], .N = N, .K = K, .group = i4 ? 128 : 0,
                                     .data = d_data, .scales = d_sc};
        loom_cuda_qgemm_set_gemv_max_m(g, fmts[fi], 4);
        const size_t sb = loom_cuda_qgemm_scratch_bytes(g, LOOM_CUDA_BF16, 0, &w, 64);
        void *d_s = dev_poison(sb), *d_y = dev_poison((size_t)64 * N * 2);
        uint16_t *y = malloc((size_t)64 * N * 2);
        for (int mi = 0; mi < 3; mi++) {
            char msg[256] = "", name[160];
            CK(cudaMemset(d_y, 0xff, (size_t)64 * N * 2));
            const int rc = loom_cuda_qgemm_run(g, LOOM_CUDA_BF16, 0, Ms[mi], &w, d_x, d_y, d_s, sb, 0, msg, sizeof msg);
            CK(cudaDeviceSynchronize());
            CK(cudaMemcpy(y, d_y, (size_t)Ms[mi] * N * 2, cudaMemcpyDeviceToHost));
            if (rc) printf("      qgemm error: %s\n", msg);
            snprintf(name, sizeof name, "qgemm %s scratch sized for 64 rows, GEMV bound 4: M=%d runs",
                     qfmt_name(fmts[fi]), Ms[mi]);
            report_bits(name, rc ? 1 : count_nan(LOOM_CUDA_BF16, y, (size_t)Ms[mi] * N, 2), Ms[mi]);
        }
        qgemm_defaults(g);
        cudaFree(d_data), cudaFree(d_sc), cudaFree(d_x), cudaFree(d_s), cudaFree(d_y);
        free(data), free(sc), free(x), free(y);
    }
}

static void test_qgemm_invariance(loom_cuda_gemm *g, loom_cuda_dt dt, loom_cuda_qfmt fmt, int N, int K,
                                  int group, bool out_f32, int Mmax) {
    const bool i4 = fmt == LOOM_CUDA_Q_INT4;
    const int ng = i4 ? K / group : 1;
    const size_t data_bytes = i4 ? (size_t)N * K / 2 : (size_t)N * K;
    const size_t nsc = (size_t)N * (i4 ? (size_t)ng * 2 : 1);
    uint8_t *data = malloc(data_bytes);
    float *sc = malloc(nsc * 4);
    for (size_t i = 0; i < data_bytes; i++)
        data[i] = fmt == LOOM_CUDA_Q_FP8 ? e4m3_enc(gpu_rng_unif(-2, 2)) : (uint8_t)gpu_rng_next();
    for (size_t i = 0; i < nsc; i++) sc[i] = i4 && i % 2 ? gpu_rng_unif(-0.1f, 0.1f) : gpu_rng_unif(0.001f, 0.02f);
    uint16_t *x = rand16(dt, (size_t)Mmax * K, -2, 2, NULL);
    void *d_data = dev_upload(data, data_bytes), *d_sc = dev_upload(sc, nsc * 4);
    void *d_x = dev_upload(x, (size_t)Mmax * K * 2);
    loom_cuda_qweight w = {.fmt = fmt, .N = N, .K = K, .group = i4 ? group : 0,
                           .data = d_data, .scales = d_sc, .smooth = NULL};
    if (g_q_tile && loom_cuda_qweight_tile(&w, dt, 0) != cudaSuccess) {
        report_bits("qgemm invariant: loom_cuda_qweight_tile failed", 1, 1);
        return;
    }
    loom_cuda_gemm_set_batch_invariant(g, 1);
    const size_t scr_inv = loom_cuda_qgemm_scratch_bytes(g, dt, out_f32, &w, Mmax);
    loom_cuda_gemm_set_batch_invariant(g, 0);
    const size_t scr_ord = loom_cuda_qgemm_scratch_bytes(g, dt, out_f32, &w, Mmax);
    const size_t scr = scr_inv > scr_ord ? scr_inv : scr_ord;
    void *d_scr = dev_poison(scr);
    const size_t oel = out_f32 ? 4 : 2, row = (size_t)N * oel;
    void *d_y = dev_poison((size_t)Mmax * row);
    char *one = malloc((size_t)Mmax * row), *many = malloc((size_t)Mmax * row), msg[256] = "", name[160];
    int rc = 0;
    loom_cuda_gemm_set_batch_invariant(g, 1);
    for (int m = 0; m < Mmax && !rc; m++)
        rc = loom_cuda_qgemm_run(g, dt, out_f32, 1, &w, (const char *)d_x + (size_t)m * K * 2,
                                 (char *)d_y + (size_t)m * row, d_scr, scr, 0, msg, sizeof msg);
    CK(cudaDeviceSynchronize());
    CK(cudaMemcpy(one, d_y, (size_t)Mmax * row, cudaMemcpyDeviceToHost));
    const long unwritten = count_nan(dt, one, (size_t)Mmax * N, oel);
    const int Ms[3] = {5, 13, Mmax};
    for (int i = 0; i < 3; i++) {
        const int M = Ms[i] < Mmax ? Ms[i] : Mmax;
        CK(cudaMemset(d_y, 0xff, (size_t)Mmax * row));
        if (!rc) rc = loom_cuda_qgemm_run(g, dt, out_f32, M, &w, d_x, d_y, d_scr, scr, 0, msg, sizeof msg);
        CK(cudaDeviceSynchronize());
        CK(cudaMemcpy(many, d_y, (size_t)M * row, cudaMemcpyDeviceToHost));
        snprintf(name, sizeof name, "qgemm invariant %s%s %s N=%d K=%d -> %s: M=%d rows = M=1 rows",
                 qfmt_name(fmt), g_q_tile ? " tiled" : "", dtn(dt), N, K, out_f32 ? "f32" : dtn(dt), M);
        if (rc) printf("      qgemm error: %s\n", msg);
        report_bits(name, rc ? 1 : bits_differ(one, many, (size_t)M * N, oel) + unwritten, M);
    }
    loom_cuda_gemm_set_batch_invariant(g, 0);
    if (!rc) {
        rc = loom_cuda_qgemm_run(g, dt, out_f32, Mmax, &w, d_x, d_y, d_scr, scr, 0, msg, sizeof msg);
        CK(cudaDeviceSynchronize());
        CK(cudaMemcpy(many, d_y, (size_t)Mmax * row, cudaMemcpyDeviceToHost));
        if (!rc)
            printf("INFO qgemm ordinary dispatch %s N=%d K=%d: %ld of %d outputs at M=%d differ from M=1\n",
                   qfmt_name(fmt), N, K, bits_differ(one, many, (size_t)Mmax * N, oel), Mmax * N, Mmax);
    }
    cudaFree(d_data), cudaFree(d_sc), cudaFree(d_x), cudaFree(d_scr), cudaFree(d_y);
    free(data), free(sc), free(x), free(one), free(many);
}

/* ---------------------------------------------------- GGUF as stored */

static const char *gg_name(loom_cuda_gguf t) { return loom_cuda_gguf_name(t); }

static void put16(uint8_t *p, uint16_t v) { p[0] = (uint8_t)v, p[1] = (uint8_t)(v >> 8); }
/* an f16 scale of magnitude about `mag`, random sign when `sign`; now and
 * then 0 (a zero block) */
static uint16_t gg_scale(float mag, bool sign) {
    if (rng_int(64) == 0) return 0;
    float v = mag * gpu_rng_unif(0.25f, 1.0f);
    return loom_fp32_to_fp16(sign && rng_int(2) ? -v : v);
}

/* One row of K weights of type t as random blocks: random codes, random
 * f16 scales scaled so the weights are about +-amp (tiny amp gives f16
 * subnormal scales). */
static void gg_fill_row(loom_cuda_gguf t, uint8_t *b, int K, float amp) {
    const int be = loom_cuda_gguf_block_elems(t), bb = loom_cuda_gguf_block_bytes(t);
    for (int i = 0; i < K / be; i++, b += bb) {
        for (int j = 0; j < bb; j++) b[j] = (uint8_t)rng_int(256);
        switch (t) {
        case LOOM_CUDA_GGUF_Q4_0: put16(b, gg_scale(amp / 8, true)); break;
        case LOOM_CUDA_GGUF_Q4_1:
            put16(b, gg_scale(amp / 8, true));
            put16(b + 2, gg_scale(amp, true));
            break;
        case LOOM_CUDA_GGUF_Q8_0: put16(b, gg_scale(amp / 127, true)); break;
        case LOOM_CUDA_GGUF_Q4_K: /* scales and mins are 6-bit codes in b[4..15] */
            put16(b, gg_scale(amp / (63 * 8), false));
            put16(b + 2, gg_scale(amp / 63, false));
            break;
        case LOOM_CUDA_GGUF_Q6_K: put16(b + 208, gg_scale(amp / (127 * 32), true)); break;
        default: break;
        }
    }
}

/* The row decoded in float32 by formats/dequant.c (the CPU backend's
 * values: every product there is exact). */
static void gg_decode_row(loom_cuda_gguf t, const uint8_t *b, int K, float *y) {
    if (loom_dequant_row((loom_dtype)t, b, y, K) != LOOM_OK) abort(); /* a type the test made */
}

/* A fused GGUF weight of nparts parts (types[i], rows[i]) x K as the cuda
 * loader lays it out (gguf_layout.h), on the device, and its float32
 * values on the host (N, K). */
typedef struct gg_weight {
    loom_cuda_qweight w;
    void *dev;
    float *wf;
    int N;
    char label[64];
} gg_weight;

static void gg_make(gg_weight *g, const loom_cuda_gguf *types, const int *rows, int nparts, int K) {
    loom_cuda_gguf_layout lay;
    int64_t r64[LOOM_CUDA_QSEG_MAX];
    int N = 0;
    for (int i = 0; i < nparts; i++) r64[i] = rows[i], N += rows[i];
    char why[200] = "";
    if (!loom_cuda_gguf_plan_group(types, r64, nparts, K, &lay, why, sizeof why)) {
        fprintf(stderr, "gguf layout: %s\n", why);
        exit(100);
    }
    uint8_t *host = calloc(lay.bytes + 16, 1);
    g->wf = malloc((size_t)N * K * sizeof(float));
    int n = 0;
    for (int i = 0; i < nparts; i++) {
        const size_t rb = loom_cuda_gguf_row_bytes(types[i], K);
        for (int r = 0; r < rows[i]; r++, n++) {
            uint8_t *row = host + lay.part_offset[i] + (size_t)r * rb;
            gg_fill_row(types[i], row, K, rng_int(8) == 0 ? 0.002f : gpu_rng_unif(0.05f, 2.0f));
            gg_decode_row(types[i], row, K, g->wf + (size_t)n * K);
        }
    }
    g->dev = dev_upload(host, lay.bytes + 16); /* the kernels may read to a 16-byte boundary */
    g->N = N;
    g->w = (loom_cuda_qweight){.fmt = LOOM_CUDA_Q_GGUF, .N = N, .K = K, .data = g->dev,
                               .nseg = lay.nseg};
    for (int i = 0; i < lay.nseg; i++)
        g->w.seg[i] = (loom_cuda_qseg){.type = lay.seg[i].type, .rows = (int)lay.seg[i].rows,
                                       .data = (const uint8_t *)g->dev + lay.seg[i].offset};
    int o = 0;
    g->label[0] = 0;
    for (int i = 0; i < nparts; i++)
        o += snprintf(g->label + o, sizeof g->label - (size_t)o, "%s%s", i ? "+" : "",
                      gg_name(types[i]));
    free(host);
}

static void gg_free(gg_weight *g) {
    cudaFree(g->dev);
    free(g->wf);
}

/* loom_cuda_qgemm_run on a GGUF weight against float64 sums over the
 * decoded weights and the dt-rounded x. path as test_qgemm: 0 default
 * dispatch (GEMV up to M = 32), 1 GEMV forced, 2 dequantize + GEMM forced. */
static void test_qgemm_gguf(loom_cuda_gemm *g, loom_cuda_dt dt, const loom_cuda_gguf *types,
                            const int *rows, int nparts, int M, int K, int path, bool out_f32) {
    gg_weight gw;
    gg_make(&gw, types, rows, nparts, K);
    const int N = gw.N;
    float *xf = malloc((size_t)M * K * 4);
    uint16_t *x = rand16(dt, (size_t)M * K, -2, 2, xf);
    void *d_x = dev_upload(x, (size_t)M * K * 2);
    const size_t oel = out_f32 ? 4 : 2;
    void *d_y = dev_poison((size_t)M * N * oel);
    if (path == 1) loom_cuda_qgemm_set_gemv_max_m(g, LOOM_CUDA_Q_GGUF, 256);
    if (path == 2) loom_cuda_qgemm_set_gemv_max_m(g, LOOM_CUDA_Q_GGUF, 0);
    const int gemv_max = path == 1 ? 256 : path == 2 ? 0 : 32;
    const size_t sb = loom_cuda_qgemm_scratch_bytes(g, dt, out_f32, &gw.w, M);
    void *d_s = dev_poison(sb);
    char msg[256] = "";
    int rc = loom_cuda_qgemm_run(g, dt, out_f32, M, &gw.w, d_x, d_y, d_s, sb, 0, msg, sizeof msg);
    loom_cuda_qgemm_set_gemv_max_m(g, LOOM_CUDA_Q_GGUF, 32);
    CK(cudaDeviceSynchronize());
    char name[160];
    snprintf(name, sizeof name, "qgemm gguf %s %s M=%d N=%d K=%d%s -> %s", gw.label, dtn(dt), M, N,
             K, path == 1 ? " gemv" : path == 2 ? " gemm" : "", out_f32 ? "f32" : dtn(dt));
    err_acc a = {0};
    if (rc) {
        printf("      qgemm error: %s\n", msg);
        a.nan = true;
        report(name, &a, TOL16);
    } else {
        void *y = malloc((size_t)M * N * oel);
        CK(cudaMemcpy(y, d_y, (size_t)M * N * oel, cudaMemcpyDeviceToHost));
        double *out = malloc((size_t)M * N * 8), *ref = malloc((size_t)M * N * 8);
#pragma omp parallel for schedule(dynamic, 1)
        for (int m = 0; m < M; m++)
            for (int n = 0; n < N; n++) {
                double acc = 0;
                const float *xm = xf + (size_t)m * K, *wn = gw.wf + (size_t)n * K;
                for (int k = 0; k < K; k++) acc += (double)xm[k] * (double)wn[k];
                ref[(size_t)m * N + n] = acc;
                out[(size_t)m * N + n] = out_f32 ? ((float *)y)[(size_t)m * N + n]
                                                 : from16(dt, ((uint16_t *)y)[(size_t)m * N + n]);
            }
        for (int m = 0; m < M; m++) err_row(&a, out + (size_t)m * N, ref + (size_t)m * N, N);
        /* the GEMV sums in fp32 throughout; the GEMM path rounds the
         * weights to dt first */
        report(name, &a, out_f32 && M <= gemv_max ? 1e-4 : TOL16);
        free(y), free(out), free(ref);
    }
    cudaFree(d_x), cudaFree(d_y), cudaFree(d_s);
    free(xf), free(x);
    gg_free(&gw);
}

/* lc_gguf_dequant (the large-M path's first half) against the CPU's decode
 * rounded to dt: every 16-bit value must be identical. */
static void test_gguf_dequant(loom_cuda_dt dt, const loom_cuda_gguf *types, const int *rows,
                              int nparts, int K) {
    gg_weight gw;
    gg_make(&gw, types, rows, nparts, K);
    const size_t n = (size_t)gw.N * K;
    void *d_o = dev_poison(n * 2);
    CK(lc_gguf_dequant(dt, &gw.w, d_o, 0));
    CK(cudaDeviceSynchronize());
    uint16_t *o = malloc(n * 2);
    CK(cudaMemcpy(o, d_o, n * 2, cudaMemcpyDeviceToHost));
    size_t bad = 0, first = n;
    for (size_t i = 0; i < n; i++)
        if (o[i] != to16(dt, gw.wf[i]) && !(isnan(gw.wf[i]) && isnan(from16(dt, o[i])))) {
            if (!bad) first = i;
            bad++;
        }
    char name[160];
    snprintf(name, sizeof name, "gguf dequant %s -> %s N=%d K=%d (bit for bit)", gw.label, dtn(dt),
             gw.N, K);
    printf("%s %-58s %zu of %zu differ\n", bad ? "FAIL" : "PASS", name, bad, n);
    if (bad)
        printf("      first at row %zu col %zu: device 0x%04x, cpu %.9g -> 0x%04x\n", first / K,
               first % K, o[first], (double)gw.wf[first], to16(dt, gw.wf[first]));
    fflush(stdout);
    if (bad) g_fail++;
    else g_pass++;
    cudaFree(d_o);
    free(o);
    gg_free(&gw);
}

/* Every block type over M = 1, 3, 8, 64 (GEMV, GEMV passes, dequantize +
 * GEMM), odd N, K of 1 / 18 / 33 blocks (q4_0, q4_1, q8_0; 1, 18 and 33
 * sub-blocks of 32: partial tiles) or 1 / 3 / 9 super-blocks (q4_k, q6_k);
 * then fused groups of mixed types, forced paths, f16, float32 output
 * (the LM head) and Llama-3-8B decode shapes. */
static void test_qgemm_gguf_all(loom_cuda_gemm *g) {
    const loom_cuda_gguf ty[5] = {LOOM_CUDA_GGUF_Q4_0, LOOM_CUDA_GGUF_Q4_1, LOOM_CUDA_GGUF_Q4_K,
                                  LOOM_CUDA_GGUF_Q6_K, LOOM_CUDA_GGUF_Q8_0};
    const int Ms[4] = {1, 3, 8, 64};
    for (int ti = 0; ti < 5; ti++) {
        const bool kq = loom_cuda_gguf_block_elems(ty[ti]) == 256;
        const int Ks[3] = {kq ? 256 : 32, kq ? 768 : 576, kq ? 2304 : 1056};
        const int N[1] = {1001};
        for (int ki = 0; ki < 3; ki++)
            for (int mi = 0; mi < 4; mi++)
                test_qgemm_gguf(g, LOOM_CUDA_BF16, &ty[ti], N, 1, Ms[mi], Ks[ki], 0, false);
        const int n3[1] = {3}, n515[1] = {515};
        test_qgemm_gguf(g, LOOM_CUDA_BF16, &ty[ti], n3, 1, 1, Ks[1], 0, false); /* < one CTA */
        test_qgemm_gguf(g, LOOM_CUDA_BF16, &ty[ti], n515, 1, 9, Ks[2], 1, false);
        test_qgemm_gguf(g, LOOM_CUDA_BF16, &ty[ti], n515, 1, 8, Ks[2], 2, false);
        test_qgemm_gguf(g, LOOM_CUDA_F16, &ty[ti], N, 1, 2, Ks[1], 0, false);
        test_qgemm_gguf(g, LOOM_CUDA_F16, &ty[ti], N, 1, 40, Ks[1], 0, false);
        test_qgemm_gguf(g, LOOM_CUDA_BF16, &ty[ti], N, 1, 5, Ks[2], 0, true);
        test_qgemm_gguf(g, LOOM_CUDA_BF16, &ty[ti], N, 1, 40, Ks[2], 2, true);
        test_gguf_dequant(LOOM_CUDA_BF16, &ty[ti], n515, 1, Ks[2]);
        test_gguf_dequant(LOOM_CUDA_F16, &ty[ti], n515, 1, Ks[1]);
    }
    /* fused groups: a Q4_K_M-like Q/K/V (q4_k, q4_k, q6_k: two segments),
     * three types (three segments), a one-type gate/up */
    const loom_cuda_gguf qkv_km[3] = {LOOM_CUDA_GGUF_Q4_K, LOOM_CUDA_GGUF_Q4_K, LOOM_CUDA_GGUF_Q6_K};
    const int qkv_rows[3] = {577, 131, 131};
    const loom_cuda_gguf three[3] = {LOOM_CUDA_GGUF_Q4_0, LOOM_CUDA_GGUF_Q8_0, LOOM_CUDA_GGUF_Q4_1};
    const int three_rows[3] = {33, 65, 97};
    const loom_cuda_gguf gu[2] = {LOOM_CUDA_GGUF_Q4_1, LOOM_CUDA_GGUF_Q4_1};
    const int gu_rows[2] = {1536, 1536};
    for (int mi = 0; mi < 4; mi++) {
        test_qgemm_gguf(g, LOOM_CUDA_BF16, qkv_km, qkv_rows, 3, Ms[mi], 1024, 0, false);
        test_qgemm_gguf(g, LOOM_CUDA_BF16, three, three_rows, 3, Ms[mi], 576, 0, false);
    }
    test_qgemm_gguf(g, LOOM_CUDA_BF16, gu, gu_rows, 2, 1, 576, 0, false);
    test_qgemm_gguf(g, LOOM_CUDA_BF16, three, three_rows, 3, 7, 576, 0, true);
    test_qgemm_gguf(g, LOOM_CUDA_F16, qkv_km, qkv_rows, 3, 33, 1024, 0, false);
    test_gguf_dequant(LOOM_CUDA_BF16, qkv_km, qkv_rows, 3, 1024);
    test_gguf_dequant(LOOM_CUDA_F16, three, three_rows, 3, 576);
    /* Llama-3-8B decode shapes (Q4_K_M: q4_k Q/K/gate/up/O, q6_k V and down) */
    const int n4096[1] = {4096};
    const loom_cuda_gguf q6[1] = {LOOM_CUDA_GGUF_Q6_K}, q4k[1] = {LOOM_CUDA_GGUF_Q4_K};
    const int qkv8b[3] = {4096, 1024, 1024};
    test_qgemm_gguf(g, LOOM_CUDA_BF16, qkv_km, qkv8b, 3, 1, 4096, 0, false);
    test_qgemm_gguf(g, LOOM_CUDA_BF16, q6, n4096, 1, 1, 14336, 0, false);
    test_qgemm_gguf(g, LOOM_CUDA_BF16, q4k, n4096, 1, 4, 4096, 0, false);
}

/* ------------------------------------------------------------------ main */

/* loom_cuda_gemm_swiglu_run: the SwiGLU fused into the GEMV (M <= 8) and
 * the swiglu + GEMM path above, against float64 of the dt-rounded act. */
static void test_swiglu_down(loom_cuda_gemm *g, loom_cuda_dt dt, int M, int N, int I) {
    float *guf = malloc((size_t)M * 2 * I * 4), *wf = malloc((size_t)N * I * 4);
    uint16_t *gu = rand16(dt, (size_t)M * 2 * I, -3, 3, guf), *w = rand16(dt, (size_t)N * I, -1, 1, wf);
    void *d_gu = dev_upload(gu, (size_t)M * 2 * I * 2), *d_w = dev_upload(w, (size_t)N * I * 2);
    void *d_act = dev_poison((size_t)M * I * 2), *d_y = dev_poison((size_t)M * N * 2);
    char msg[256] = "", name[128];
    int rc = loom_cuda_gemm_swiglu_run(g, dt, M, N, I, d_gu, d_w, d_act, d_y, 0, msg, sizeof msg);
    CK(cudaDeviceSynchronize());
    snprintf(name, sizeof name, "swiglu+down %s M=%d N=%d I=%d (swiglu, then gemv/gemm)", dtn(dt), M, N, I);
    err_acc a = {0};
    if (rc) {
        printf("      error: %s\n", msg);
        a.nan = true;
    } else {
        uint16_t *y = malloc((size_t)M * N * 2);
        double *act = malloc((size_t)I * 8), *out = malloc((size_t)N * 8), *ref = malloc((size_t)N * 8);
        CK(cudaMemcpy(y, d_y, (size_t)M * N * 2, cudaMemcpyDeviceToHost));
        for (int m = 0; m < M; m++) {
            for (int i = 0; i < I; i++) {
                double gv = guf[(size_t)m * 2 * I + i], uv = guf[(size_t)m * 2 * I + I + i];
                act[i] = from16(dt, to16(dt, (float)(gv / (1.0 + exp(-gv)) * uv)));
            }
            for (int n = 0; n < N; n++) {
                double sum = 0;
                for (int i = 0; i < I; i++) sum += act[i] * wf[(size_t)n * I + i];
                ref[n] = sum;
                out[n] = from16(dt, y[(size_t)m * N + n]);
            }
            err_row(&a, out, ref, N);
        }
        free(y), free(act), free(out), free(ref);
    }
    report(name, &a, TOL16);
    cudaFree(d_gu), cudaFree(d_w), cudaFree(d_act), cudaFree(d_y);
    free(guf), free(wf), free(gu), free(w);
}

/* ------------------------------------------------------- mixture of experts */

/* Logits of T tokens over E experts by mode: 0 uniform U(-4, 4); 1 ties
 * (values from {0, 0.5, 1, 1.5}: equal probabilities everywhere); 2 one
 * expert (3 % E) far ahead for every token; 3 only experts < K + 1 ever
 * likely (the others take no token). */
static float *moe_logits(int T, int E, int K, int mode) {
    float *lg = malloc((size_t)T * E * 4);
    for (int t = 0; t < T; t++)
        for (int e = 0; e < E; e++) {
            float v = mode == 1 ? 0.5f * (float)rng_int(4) : gpu_rng_unif(-4, 4);
            if (mode == 2 && e == 3 % E) v = 20.0f;
            if (mode == 3) v = e <= K ? gpu_rng_unif(10, 12) : gpu_rng_unif(-30, -28);
            lg[(size_t)t * E + e] = v;
        }
    return lg;
}

/* The router against float64: each token's chosen experts distinct and
 * valid; in descending float64 probability and no unchosen expert more
 * likely than a chosen one (within 1e-6 relative: float32 may order
 * near-equal probabilities either way); where logits are exactly equal,
 * the lower expert first; weights (renormalised when norm) within 1e-5 of
 * the float64 ones of the experts chosen. */
static void test_moe_route(int T, int E, int K, bool norm, int mode) {
    float *lg = moe_logits(T, E, K, mode);
    float *d_lg = dev_upload(lg, (size_t)T * E * 4), *d_wt = dev_poison((size_t)T * K * 4);
    int32_t *d_sel = dev_poison((size_t)T * K * 4);
    /* expert parallelism: the same routing as a rank holding experts
     * [e0, e0 + el) sees it (local numbers, -1 for the others; weights
     * bit for bit) */
    const int e0 = E / 3, el = E - E / 3 - E / 4 > 0 ? E - E / 3 - E / 4 : 1;
    float *d_wtl = dev_poison((size_t)T * K * 4);
    int32_t *d_sell = dev_poison((size_t)T * K * 4);
    CK(loom_cuda_moe_route(d_lg, T, E, K, norm, 0, E, d_sel, d_wt, 0));
    CK(loom_cuda_moe_route(d_lg, T, E, K, norm, e0, el, d_sell, d_wtl, 0));
    CK(cudaDeviceSynchronize());
    int32_t *sel = malloc((size_t)T * K * 4), *sell = malloc((size_t)T * K * 4);
    float *wt = malloc((size_t)T * K * 4), *wtl = malloc((size_t)T * K * 4);
    CK(cudaMemcpy(sel, d_sel, (size_t)T * K * 4, cudaMemcpyDeviceToHost));
    CK(cudaMemcpy(wt, d_wt, (size_t)T * K * 4, cudaMemcpyDeviceToHost));
    CK(cudaMemcpy(sell, d_sell, (size_t)T * K * 4, cudaMemcpyDeviceToHost));
    CK(cudaMemcpy(wtl, d_wtl, (size_t)T * K * 4, cudaMemcpyDeviceToHost));
    long slice_bad = 0;
    for (int i = 0; i < T * K; i++) {
        const int want = sel[i] >= e0 && sel[i] < e0 + el ? sel[i] - e0 : -1;
        slice_bad += sell[i] != want || memcmp(&wt[i], &wtl[i], 4) != 0;
    }
    double *p = malloc((size_t)E * 8);
    long bad = 0;
    double werr = 0;
    for (int t = 0; t < T; t++) {
        const float *l = lg + (size_t)t * E;
        double mx = l[0], sum = 0, ksum = 0;
        for (int e = 1; e < E; e++) mx = l[e] > mx ? l[e] : mx;
        for (int e = 0; e < E; e++) sum += p[e] = exp((double)l[e] - mx);
        for (int e = 0; e < E; e++) p[e] /= sum;
        bool chosen[LOOM_CUDA_MOE_MAX_EXPERTS] = {false};
        for (int j = 0; j < K; j++) {
            const int s = sel[(size_t)t * K + j];
            if (s < 0 || s >= E || chosen[s]) {
                bad++;
                continue;
            }
            chosen[s] = true;
            ksum += p[s];
            if (j > 0) {
                const int q = sel[(size_t)t * K + j - 1];
                if (q >= 0 && q < E && (p[s] > p[q] * (1 + 1e-6) || (l[s] == l[q] && s < q))) bad++;
            }
        }
        for (int e = 0; e < E; e++)
            for (int j = 0; j < K && !chosen[e]; j++) {
                const int s = sel[(size_t)t * K + j];
                if (s < 0 || s >= E) continue;
                if (p[e] > p[s] * (1 + 1e-6) || (l[e] == l[s] && e < s)) bad++;
            }
        for (int j = 0; j < K; j++) {
            const int s = sel[(size_t)t * K + j];
            if (s < 0 || s >= E) continue;
            const double ref = norm ? p[s] / ksum : p[s];
            const double d = fabs(wt[(size_t)t * K + j] - ref);
            if (!(d <= werr)) werr = d;
        }
    }
    static const char *const modes[4] = {"uniform", "ties", "one-expert", "idle-experts"};
    char name[128];
    snprintf(name, sizeof name, "moe route T=%d E=%d K=%d %s %s (order)", T, E, K, norm ? "renorm" : "raw",
             modes[mode]);
    report_count(name, bad, (long)T * K);
    snprintf(name, sizeof name, "moe route T=%d E=%d K=%d %s %s (weights)", T, E, K, norm ? "renorm" : "raw",
             modes[mode]);
    err_acc a = {.worst = werr, .rows = T};
    report(name, &a, TOL32);
    snprintf(name, sizeof name, "moe route T=%d E=%d K=%d %s %s (experts %d..%d of a rank)", T, E, K,
             norm ? "renorm" : "raw", modes[mode], e0, e0 + el - 1);
    report_count(name, slice_bad, (long)T * K);
    cudaFree(d_lg), cudaFree(d_wt), cudaFree(d_sel), cudaFree(d_wtl), cudaFree(d_sell);
    free(lg), free(sel), free(wt), free(p), free(sell), free(wtl);
}

/* Grouping P pairs by expert: off the prefix of the counts, perm a
 * permutation with every sorted row in its expert's segment, inv its
 * inverse, the tiles covering each segment exactly (rows <= bm, in order)
 * and no more of them than loom_cuda_moe_max_tiles. */
static void test_moe_group(int P, int E, int mode, int bm) {
    int32_t *sel = malloc((size_t)P * 4);
    for (int p = 0; p < P; p++) /* mode 3: about half the pairs another rank's (-1) */
        sel[p] = mode == 0 ? rng_int(E) : mode == 1 ? E - 1 : mode == 2 ? (rng_int(2) ? 0 : E / 2)
                                                             : (rng_int(2) ? rng_int(E) : -1);
    const int mt = loom_cuda_moe_max_tiles(P, E, bm);
    int32_t *d_sel = dev_upload(sel, (size_t)P * 4), *d_off = dev_poison((size_t)(E + 1) * 4);
    int32_t *d_perm = dev_poison((size_t)P * 4), *d_inv = dev_poison((size_t)P * 4);
    int32_t *d_tiles = dev_poison((size_t)(1 + 3 * mt) * 4);
    CK(loom_cuda_moe_group(d_sel, P, E, bm, d_off, d_perm, d_inv, d_tiles, 0));
    CK(cudaDeviceSynchronize());
    int32_t *off = malloc((size_t)(E + 1) * 4), *perm = malloc((size_t)P * 4), *inv = malloc((size_t)P * 4);
    int32_t *tiles = malloc((size_t)(1 + 3 * mt) * 4), *cnt = calloc((size_t)E, 4), *seen = calloc((size_t)P, 4);
    CK(cudaMemcpy(off, d_off, (size_t)(E + 1) * 4, cudaMemcpyDeviceToHost));
    CK(cudaMemcpy(perm, d_perm, (size_t)P * 4, cudaMemcpyDeviceToHost));
    CK(cudaMemcpy(inv, d_inv, (size_t)P * 4, cudaMemcpyDeviceToHost));
    CK(cudaMemcpy(tiles, d_tiles, (size_t)(1 + 3 * mt) * 4, cudaMemcpyDeviceToHost));
    long bad = 0;
    int32_t local = 0; /* pairs of this rank's experts: they alone get rows */
    for (int p = 0; p < P; p++) {
        if (sel[p] >= 0) cnt[sel[p]]++, local++;
        else bad += inv[p] != -1;
    }
    int32_t o = 0;
    for (int e = 0; e < E; e++) {
        bad += off[e] != o;
        o += cnt[e];
    }
    bad += off[E] != local;
    for (int i = 0; i < local && !bad; i++) {
        const int32_t p = perm[i];
        if (p < 0 || p >= P || sel[p] < 0 || seen[p]++ || inv[p] != i || i < off[sel[p]] || i >= off[sel[p] + 1])
            bad++;
    }
    const int n = tiles[0];
    bad += n < 0 || n > mt;
    int32_t next = 0; /* tiles in order cover [0, P) expert by expert */
    for (int k = 0; k < n && !bad; k++) {
        const int32_t e = tiles[1 + 3 * k], r = tiles[2 + 3 * k], m = tiles[3 + 3 * k];
        if (e < 0 || e >= E || r != next || m < 1 || m > bm || r < off[e] || r + m > off[e + 1]) bad++;
        next = r + m;
    }
    bad += !bad && next != local;
    static const char *const modes[4] = {"uniform", "all-one-expert", "two-experts", "half another rank's"};
    char name[128];
    snprintf(name, sizeof name, "moe group P=%d E=%d %s, %d-row tiles", P, E, modes[mode], bm);
    report_count(name, bad, P);
    cudaFree(d_sel), cudaFree(d_off), cudaFree(d_perm), cudaFree(d_inv), cudaFree(d_tiles);
    free(sel), free(off), free(perm), free(inv), free(tiles), free(cnt), free(seen);
}

/* The all-to-all form's packing (loom_cuda_moe_ids, loom_cuda_moe_gather,
 * loom_cuda_moe_owner_counts) against the host: ids through a permutation
 * with an offset and a limit (out of range -> -1), without one; rows
 * gathered through rows[i] / div, without rows, and with every 7th row -1
 * (zeros), byte for byte; each of 4 owners' pairs from a grouping's
 * offsets. */
static void test_moe_pack(int n, int H, int div) {
    int32_t *sel = malloc((size_t)n * 4), *perm = malloc((size_t)n * 4);
    const int nx = (n + div - 1) / div;
    uint16_t *x = malloc((size_t)nx * H * 2);
    for (int i = 0; i < n; i++) sel[i] = rng_int(64) - 8, perm[i] = i;
    for (int i = n - 1; i > 0; i--) { /* a random permutation */
        const int j = rng_int(i + 1), t = perm[i];
        perm[i] = perm[j], perm[j] = t;
    }
    for (size_t i = 0; i < (size_t)nx * H; i++) x[i] = (uint16_t)rng_int(65536);
    int32_t *d_sel = dev_upload(sel, (size_t)n * 4), *d_perm = dev_upload(perm, (size_t)n * 4);
    int32_t *d_a = dev_poison((size_t)n * 4), *d_b = dev_poison((size_t)n * 4);
    void *d_x = dev_upload(x, (size_t)nx * H * 2), *d_g = dev_poison((size_t)n * H * 2);
    void *d_h = dev_poison((size_t)nx * H * 2), *d_z = dev_poison((size_t)n * H * 2);
    int32_t *neg = malloc((size_t)n * 4), off[17], cnt4[4];
    for (int i = 0; i < n; i++) neg[i] = i % 7 == 3 ? -1 : perm[i];
    off[0] = 0;
    for (int e = 0; e < 16; e++) off[e + 1] = off[e] + rng_int(5);
    int32_t *d_neg = dev_upload(neg, (size_t)n * 4), *d_off = dev_upload(off, sizeof off);
    int32_t *d_cnt = dev_poison(sizeof cnt4);
    CK(loom_cuda_moe_gather(d_x, d_neg, div, n, H, d_z, 0));
    CK(loom_cuda_moe_owner_counts(d_off, 4, 4, d_cnt, 0));
    CK(loom_cuda_moe_ids(d_sel, d_perm, n, -5, 40, d_a, 0));
    CK(loom_cuda_moe_ids(d_sel, NULL, n, 0, 64, d_b, 0));
    CK(loom_cuda_moe_gather(d_x, d_perm, div, n, H, d_g, 0));
    CK(loom_cuda_moe_gather(d_x, NULL, 1, nx, H, d_h, 0));
    CK(cudaDeviceSynchronize());
    int32_t *a = malloc((size_t)n * 4), *b = malloc((size_t)n * 4);
    uint16_t *g = malloc((size_t)n * H * 2), *hh = malloc((size_t)nx * H * 2);
    CK(cudaMemcpy(a, d_a, (size_t)n * 4, cudaMemcpyDeviceToHost));
    CK(cudaMemcpy(b, d_b, (size_t)n * 4, cudaMemcpyDeviceToHost));
    CK(cudaMemcpy(g, d_g, (size_t)n * H * 2, cudaMemcpyDeviceToHost));
    CK(cudaMemcpy(hh, d_h, (size_t)nx * H * 2, cudaMemcpyDeviceToHost));
    uint16_t *z = malloc((size_t)n * H * 2), *zero = calloc((size_t)H, 2);
    CK(cudaMemcpy(z, d_z, (size_t)n * H * 2, cudaMemcpyDeviceToHost));
    CK(cudaMemcpy(cnt4, d_cnt, sizeof cnt4, cudaMemcpyDeviceToHost));
    long bad = 0;
    for (int d = 0; d < 4; d++) bad += cnt4[d] != off[4 * d + 4] - off[4 * d];
    for (int i = 0; i < n; i++)
        bad += memcmp(z + (size_t)i * H, neg[i] < 0 ? zero : x + (size_t)(neg[i] / div) * H, (size_t)H * 2) != 0;
    for (int i = 0; i < n; i++) {
        const int v = sel[perm[i]] - 5, w = sel[i];
        bad += a[i] != (v >= 0 && v < 40 ? v : -1);
        bad += b[i] != (w >= 0 && w < 64 ? w : -1);
        bad += memcmp(g + (size_t)i * H, x + (size_t)(perm[i] / div) * H, (size_t)H * 2) != 0;
    }
    bad += memcmp(hh, x, (size_t)nx * H * 2) != 0;
    char name[96];
    snprintf(name, sizeof name, "moe all-to-all packing n=%d H=%d div=%d (ids, rows)", n, H, div);
    report_count(name, bad, 4L * n + 5);
    void *dv[] = {d_sel, d_perm, d_a, d_b, d_x, d_g, d_h, d_z, d_neg, d_off, d_cnt};
    for (size_t i = 0; i < sizeof dv / sizeof dv[0]; i++) cudaFree(dv[i]);
    free(sel), free(perm), free(x), free(a), free(b), free(g), free(hh), free(z), free(zero), free(neg);
}

/* The routed FFN for T tokens as the backend runs it — route, then either
 * the per-pair GEMVs (gemv 1) or group + grouped GEMMs (0), SwiGLU between,
 * combine (with a shared expert of width S when S > 0) — against float64
 * over the same dt inputs, with the device's routing and its dt roundings
 * of gu, act and the expert outputs mirrored. gemv 3 / 4: the grouped GEMMs
 * on wgmma (loom_cuda_moe_gemm_wg) over 64- / 128-row tiles. gemv 2: the fused pair
 * (loom_cuda_moe_gemv_swiglu, loom_cuda_moe_gemv_combine: only act is
 * rounded; no shared expert). Expert parallelism: as rank `rank` of
 * `ranks` (E % ranks == 0) — its E / ranks experts' slice of the stacked
 * weights, the routing's local numbers checked against a whole routing,
 * and only that rank's choices in the reference. */
static void test_moe_ffn(loom_cuda_dt dt, int T, int E, int K, int I, int H, int S, int mode, int gemv, int ranks,
                         int rank) {
    if (gemv == 2 && S) return; /* the fused pair has no shared expert */
    const bool fused = gemv == 2;
    const int el = E / ranks, e0 = rank * el;
    const int bm = gemv == 4 ? 128 : LOOM_CUDA_MOE_TILE_ROWS;
    const int P = T * K, mt = loom_cuda_moe_max_tiles(P, el, bm);
    float *xf = malloc((size_t)T * H * 4), *wguf = malloc((size_t)E * 2 * I * H * 4);
    float *wdf = malloc((size_t)E * H * I * 4), *ysf = malloc((size_t)T * H * 4), *gate = malloc((size_t)H * 4);
    const float a1 = 1.0f / sqrtf((float)H), a2 = 1.0f / sqrtf((float)I);
    uint16_t *x = rand16(dt, (size_t)T * H, -2, 2, xf), *wgu = rand16(dt, (size_t)E * 2 * I * H, -a1, a1, wguf);
    uint16_t *wd = rand16(dt, (size_t)E * H * I, -a2, a2, wdf), *ysh = rand16(dt, (size_t)T * H, -1, 1, ysf);
    for (int i = 0; i < H; i++) gate[i] = gpu_rng_unif(-a1, a1);
    float *lg = moe_logits(T, E, K, mode);
    void *d_x = dev_upload(x, (size_t)T * H * 2), *d_wgu = dev_upload(wgu, (size_t)E * 2 * I * H * 2);
    void *d_wd = dev_upload(wd, (size_t)E * H * I * 2), *d_ysh = dev_upload(ysh, (size_t)T * H * 2);
    float *d_gate = dev_upload(gate, (size_t)H * 4), *d_lg = dev_upload(lg, (size_t)T * E * 4);
    float *d_wt = dev_poison((size_t)P * 4);
    int32_t *d_sel = dev_poison((size_t)P * 4), *d_off = dev_poison((size_t)(E + 1) * 4);
    int32_t *d_perm = dev_poison((size_t)P * 4), *d_inv = dev_poison((size_t)P * 4);
    int32_t *d_tiles = dev_poison((size_t)(1 + 3 * mt) * 4), *d_selg = dev_poison((size_t)P * 4);
    void *d_gu = dev_poison((size_t)P * 2 * I * 2), *d_act = dev_poison((size_t)P * I * 2);
    void *d_y = dev_poison((size_t)P * H * 2), *d_r = dev_poison((size_t)T * H * 2);
    /* the rank's experts: a window of the stacked weights */
    const void *d_wgu_l = (const uint8_t *)d_wgu + (size_t)e0 * 2 * I * H * 2;
    const void *d_wd_l = (const uint8_t *)d_wd + (size_t)e0 * H * I * 2;
    CK(loom_cuda_moe_route(d_lg, T, E, K, 1, 0, E, d_selg, d_wt, 0));
    CK(loom_cuda_moe_route(d_lg, T, E, K, 1, e0, el, d_sel, d_wt, 0));
    if (fused) {
        CK(loom_cuda_moe_gemv_swiglu(dt, d_x, K, d_sel, d_wgu_l, P, I, H, d_act, 0));
        CK(loom_cuda_moe_gemv_combine(dt, d_act, d_sel, d_wt, d_wd_l, T, K, H, I, d_r, 0));
    } else if (gemv == 1) {
        CK(loom_cuda_moe_gemv(dt, d_x, K, d_sel, d_wgu_l, P, 2 * I, H, d_gu, 0));
        CK(loom_cuda_swiglu(dt, d_act, d_gu, P, I, 0));
        CK(loom_cuda_moe_gemv(dt, d_act, 1, d_sel, d_wd_l, P, H, I, d_y, 0));
    } else {
        CK(loom_cuda_moe_group(d_sel, P, el, bm, d_off, d_perm, d_inv, d_tiles, 0));
        if (gemv >= 3) {
            CK(loom_cuda_moe_gemm_wg(dt, d_x, d_perm, K, d_wgu_l, d_tiles, mt, bm, 2 * I, H, d_gu, 0));
            CK(loom_cuda_swiglu(dt, d_act, d_gu, P, I, 0));
            CK(loom_cuda_moe_gemm_wg(dt, d_act, NULL, 1, d_wd_l, d_tiles, mt, bm, H, I, d_y, 0));
        } else {
            CK(loom_cuda_moe_gemm(dt, d_x, d_perm, K, d_wgu_l, d_tiles, mt, 2 * I, H, d_gu, 0));
            CK(loom_cuda_swiglu(dt, d_act, d_gu, P, I, 0));
            CK(loom_cuda_moe_gemm(dt, d_act, NULL, 1, d_wd_l, d_tiles, mt, H, I, d_y, 0));
        }
    }
    if (!fused)
        CK(loom_cuda_moe_combine(dt, d_r, d_y, gemv == 1 ? NULL : d_inv, d_wt, T, K, H, S ? d_ysh : NULL, d_x, d_gate,
                                 0));
    CK(cudaDeviceSynchronize());
    int32_t *sel = malloc((size_t)P * 4), *selg = malloc((size_t)P * 4);
    float *wt = malloc((size_t)P * 4);
    uint16_t *r = malloc((size_t)T * H * 2);
    CK(cudaMemcpy(sel, d_sel, (size_t)P * 4, cudaMemcpyDeviceToHost));
    CK(cudaMemcpy(selg, d_selg, (size_t)P * 4, cudaMemcpyDeviceToHost));
    CK(cudaMemcpy(wt, d_wt, (size_t)P * 4, cudaMemcpyDeviceToHost));
    CK(cudaMemcpy(r, d_r, (size_t)T * H * 2, cudaMemcpyDeviceToHost));
    double *gu = malloc((size_t)2 * I * 8), *act = malloc((size_t)I * 8), *ref = malloc((size_t)H * 8);
    double *out = malloc((size_t)H * 8);
    err_acc a = {0};
    for (int t = 0; t < T; t++) {
        const float *xr = xf + (size_t)t * H;
        for (int h = 0; h < H; h++) ref[h] = 0;
        for (int j = 0; j < K; j++) {
            const int e = selg[(size_t)t * K + j]; /* the whole model's number */
            const bool mine = e >= e0 && e < e0 + el;
            if (e < 0 || e >= E || sel[(size_t)t * K + j] != (mine ? e - e0 : -1)) {
                a.nan = true;
                continue;
            }
            if (!mine) continue; /* another rank's share */
            for (int n = 0; n < 2 * I; n++) {
                double s = 0;
                for (int k = 0; k < H; k++) s += (double)xr[k] * wguf[((size_t)e * 2 * I + n) * H + k];
                gu[n] = fused ? s : from16(dt, to16(dt, (float)s));
            }
            for (int i = 0; i < I; i++) act[i] = from16(dt, to16(dt, (float)(gu[i] / (1.0 + exp(-gu[i])) * gu[I + i])));
            for (int h = 0; h < H; h++) {
                double s = 0;
                for (int i = 0; i < I; i++) s += act[i] * wdf[((size_t)e * H + h) * I + i];
                ref[h] += wt[(size_t)t * K + j] * (fused ? s : from16(dt, to16(dt, (float)s)));
            }
        }
        if (S) {
            double d = 0;
            for (int k = 0; k < H; k++) d += (double)xr[k] * gate[k];
            const double g = 1.0 / (1.0 + exp(-d));
            for (int h = 0; h < H; h++) ref[h] += g * ysf[(size_t)t * H + h];
        }
        for (int h = 0; h < H; h++) out[h] = from16(dt, r[(size_t)t * H + h]);
        err_row(&a, out, ref, H);
    }
    static const char *const modes[4] = {"uniform", "ties", "one-expert", "idle-experts"};
    char name[160], rk[32] = "";
    if (ranks > 1) snprintf(rk, sizeof rk, " rank %d/%d", rank, ranks);
    snprintf(name, sizeof name, "moe ffn %s %s T=%d E=%d K=%d I=%d H=%d%s %s%s", dtn(dt),
             fused ? "gemv+swiglu, gemv+combine" : gemv == 1 ? "gemv" : gemv == 3 ? "grouped wgmma"
                                                 : gemv == 4 ? "grouped wgmma 128-row" : "grouped", T, E,
             K, I, H, S ? " +shared" : "", modes[mode], rk);
    report(name, &a, TOL16);
    void *dv[] = {d_x,    d_wgu, d_wd,    d_ysh, d_gate, d_lg, d_wt, d_sel, d_off,
                  d_perm, d_inv, d_tiles, d_gu,  d_act,  d_y,  d_r,  d_selg};
    for (size_t i = 0; i < sizeof dv / sizeof dv[0]; i++) cudaFree(dv[i]);
    free(xf), free(wguf), free(wdf), free(ysf), free(gate), free(x), free(wgu), free(wd), free(ysh), free(lg);
    free(sel), free(selg), free(wt), free(r), free(gu), free(act), free(ref), free(out);
}

/* A stacked quantized expert weight (loom_cuda_moe_qgemv's layout): E
 * random (N, K) matrices in fmt, their exact dequantized values in deq
 * (E, N, K) — int8 q s, e4m3 e s, int4 q s + b per group — and its device
 * copy in *qw. deq16 (INT4 only, else deq): what the grouped GEMM's loader
 * puts in shared memory, fmaf(q, s, b) rounded to dt (int8 / e4m3 codes are
 * exact in dt and scaled in the epilogue, so their deq stands). */
typedef struct mq_host {
    uint8_t *data;
    float *sc;
    double *deq, *deq16;
    void *d_data, *d_sc;
} mq_host;

static void mq_make(loom_cuda_dt dt, loom_cuda_qfmt f, int E, int N, int K, int g, float amp, mq_host *m,
                    loom_cuda_qweight *qw) {
    const bool i4 = f == LOOM_CUDA_Q_INT4;
    *qw = (loom_cuda_qweight){.fmt = f, .N = N, .K = K, .group = i4 ? g : 0};
    const size_t db = loom_cuda_moe_qdata_bytes(qw), sf = loom_cuda_moe_qscale_floats(qw);
    m->data = calloc((size_t)E * db, 1);
    m->sc = malloc((size_t)E * sf * 4);
    m->deq = malloc((size_t)E * N * K * sizeof(double));
    m->deq16 = i4 ? malloc((size_t)E * N * K * sizeof(double)) : m->deq;
    for (int e = 0; e < E; e++)
        for (int n = 0; n < N; n++) {
            uint8_t *row = m->data + (size_t)e * db + (size_t)n * (i4 ? K / 2 : K);
            double *dq = m->deq + ((size_t)e * N + n) * K;
            if (!i4) {
                const float s = (f == LOOM_CUDA_Q_FP8 ? amp / 448.0f : amp / 127.0f) * gpu_rng_unif(0.5f, 1.5f);
                m->sc[(size_t)e * sf + n] = s;
                for (int k = 0; k < K; k++) {
                    if (f == LOOM_CUDA_Q_FP8) {
                        row[k] = e4m3_enc(gpu_rng_unif(-448.0f, 448.0f));
                        dq[k] = e4m3_dec(row[k]) * s;
                    } else {
                        const int q = rng_int(255) - 127;
                        row[k] = (uint8_t)(int8_t)q;
                        dq[k] = (double)q * s;
                    }
                }
                continue;
            }
            for (int gi = 0; gi < K / g; gi++) {
                const float s = amp / 7.5f * gpu_rng_unif(0.5f, 1.5f), b = -(float)rng_int(16) * s;
                float *sb = m->sc + (size_t)e * sf + ((size_t)n * (K / g) + gi) * 2;
                sb[0] = s, sb[1] = b;
                for (int k = gi * g; k < (gi + 1) * g; k++) {
                    const int q = rng_int(16);
                    row[k / 2] |= (uint8_t)(k % 2 ? q << 4 : q);
                    dq[k] = (double)q * s + b;
                    m->deq16[((size_t)e * N + n) * K + k] = from16(dt, to16(dt, fmaf((float)q, s, b)));
                }
            }
        }
    m->d_data = dev_upload(m->data, (size_t)E * db);
    m->d_sc = dev_upload(m->sc, (size_t)E * sf * 4);
    qw->data = m->d_data, qw->scales = m->d_sc;
}

static void mq_free(mq_host *m) {
    if (m->deq16 != m->deq) free(m->deq16);
    free(m->data), free(m->sc), free(m->deq);
    cudaFree(m->d_data), cudaFree(m->d_sc);
}

static const char *qfn(loom_cuda_qfmt f) {
    return f == LOOM_CUDA_Q_INT8_W8A16 ? "w8a16" : f == LOOM_CUDA_Q_INT8_W8A8 ? "w8a8" : f == LOOM_CUDA_Q_FP8 ? "fp8" : "int4";
}

/* Activation codes decoded (deq = code x sx) against the row they encode
 * (ref), element by element: round to nearest leaves int8 within half a
 * step (0.5 sx) and e4m3 within half an ulp — 2^-4 of the value for
 * normals, 2^-10 sx below 2^-6 sx (subnormals); the row's scale must be
 * its largest |ref| over 127 (448) up to `rel`. rel: how far the row the
 * device quantized may be from ref (0 for the given inputs; the SwiGLU rows,
 * formed from the device's gate|up output in float and rounded to dt, one
 * dt rounding: 2^-7 covers a bf16 ulp). Returns the number of elements (and
 * a bad scale as one) outside. */
static long mq_codes_bad(int aq, const double *deq, const double *ref, int n, float sx, double rel) {
    long bad = 0;
    double amax = 0;
    for (int i = 0; i < n; i++) {
        const double r = fabs(ref[i]);
        amax = r > amax ? r : amax;
        const double half = aq == 1 ? 0.5 * sx : fmax(0x1p-4 * r, 0x1p-10 * sx);
        /* 1e-4: the float product v / sx may sit an ulp off a rounding tie */
        if (!(fabs(deq[i] - ref[i]) <= half * (1 + 1e-4) + rel * r + 1e-30)) bad++;
    }
    const double want = amax / (aq == 1 ? 127.0 : 448.0);
    if (!(fabs(sx - want) <= (rel + 1e-6) * want + 1e-30)) bad++;
    return bad;
}

/* The routed FFN on quantized experts (moe_quant.cu) as the backend runs
 * it — route; W8A8 / FP8: the input rows' codes; per-pair GEMVs or group +
 * grouped GEMMs; SwiGLU (W8A8 / FP8: into the down projection's codes);
 * combine — against float64 over the exact dequantized weights (INT4 on
 * the grouped GEMM: rounded to dt as its loader does, mq_host), with the
 * device's routing, its activation codes (checked on their own against the
 * rows they encode, mq_codes_bad) and its dt roundings of gu, act and y
 * mirrored. ranks / rank: as test_moe_ffn's expert-parallel rank. */
static void test_moe_qffn(loom_cuda_dt dt, loom_cuda_qfmt f, int T, int E, int K, int I, int H, int g, int mode,
                          bool gemv, int ranks, int rank) {
    const int el = E / ranks, e0 = rank * el;
    const int P = T * K, mt = loom_cuda_moe_max_tiles(P, el, LOOM_CUDA_MOE_TILE_ROWS), aq = loom_cuda_moe_qacts(f);
    float *xf = malloc((size_t)T * H * 4);
    uint16_t *x = rand16(dt, (size_t)T * H, -2, 2, xf);
    mq_host mgu, md;
    loom_cuda_qweight qgu, qd;
    mq_make(dt, f, E, 2 * I, H, g, 1.0f / sqrtf((float)H), &mgu, &qgu);
    mq_make(dt, f, E, H, I, g, 1.0f / sqrtf((float)I), &md, &qd);
    const double *wgu = gemv ? mgu.deq : mgu.deq16, *wdn = gemv ? md.deq : md.deq16;
    float *lg = moe_logits(T, E, K, mode);
    void *d_x = dev_upload(x, (size_t)T * H * 2);
    float *d_lg = dev_upload(lg, (size_t)T * E * 4), *d_wt = dev_poison((size_t)P * 4);
    int32_t *d_sel = dev_poison((size_t)P * 4), *d_off = dev_poison((size_t)(E + 1) * 4);
    int32_t *d_perm = dev_poison((size_t)P * 4), *d_inv = dev_poison((size_t)P * 4);
    int32_t *d_tiles = dev_poison((size_t)(1 + 3 * mt) * 4);
    void *d_gu = dev_poison((size_t)P * 2 * I * 2), *d_act = dev_poison((size_t)P * I * 2);
    void *d_y = dev_poison((size_t)P * H * 2), *d_r = dev_poison((size_t)T * H * 2);
    uint8_t *d_xq = dev_poison((size_t)T * H), *d_aq = dev_poison((size_t)P * I);
    float *d_xsx = dev_poison((size_t)T * 4), *d_asx = dev_poison((size_t)P * 4);
    int32_t *d_selg = dev_poison((size_t)P * 4);
    /* the rank's experts: a window of each stacked weight */
    loom_cuda_qweight qgu_l = qgu, qd_l = qd;
    qgu_l.data = (const uint8_t *)qgu.data + (size_t)e0 * loom_cuda_moe_qdata_bytes(&qgu);
    qgu_l.scales = qgu.scales + (size_t)e0 * loom_cuda_moe_qscale_floats(&qgu);
    qd_l.data = (const uint8_t *)qd.data + (size_t)e0 * loom_cuda_moe_qdata_bytes(&qd);
    qd_l.scales = qd.scales + (size_t)e0 * loom_cuda_moe_qscale_floats(&qd);
    CK(loom_cuda_moe_route(d_lg, T, E, K, 1, 0, E, d_selg, d_wt, 0));
    CK(loom_cuda_moe_route(d_lg, T, E, K, 1, e0, el, d_sel, d_wt, 0));
    if (aq) CK(loom_cuda_moe_quant_act(dt, f, 0, T, H, d_x, d_xq, d_xsx, 0));
    if (gemv) {
        CK(loom_cuda_moe_qgemv(dt, d_x, d_xq, d_xsx, K, d_sel, &qgu_l, P, d_gu, 0));
    } else {
        CK(loom_cuda_moe_group(d_sel, P, el, LOOM_CUDA_MOE_TILE_ROWS, d_off, d_perm, d_inv, d_tiles, 0));
        CK(loom_cuda_moe_qgemm(dt, d_x, d_xq, d_xsx, d_perm, K, &qgu_l, d_tiles, mt, d_gu, 0));
    }
    if (aq) CK(loom_cuda_moe_quant_act(dt, f, 1, P, I, d_gu, d_aq, d_asx, 0));
    else CK(loom_cuda_swiglu(dt, d_act, d_gu, P, I, 0));
    if (gemv) CK(loom_cuda_moe_qgemv(dt, d_act, d_aq, d_asx, 1, d_sel, &qd_l, P, d_y, 0));
    else CK(loom_cuda_moe_qgemm(dt, d_act, d_aq, d_asx, NULL, 1, &qd_l, d_tiles, mt, d_y, 0));
    CK(loom_cuda_moe_combine(dt, d_r, d_y, gemv ? NULL : d_inv, d_wt, T, K, H, NULL, d_x, NULL, 0));
    CK(cudaDeviceSynchronize());
    int32_t *sel = malloc((size_t)P * 4), *inv = malloc((size_t)P * 4), *selg = malloc((size_t)P * 4);
    CK(cudaMemcpy(selg, d_selg, (size_t)P * 4, cudaMemcpyDeviceToHost));
    float *wt = malloc((size_t)P * 4), *xsx = malloc((size_t)T * 4), *asx = malloc((size_t)P * 4);
    uint16_t *r = malloc((size_t)T * H * 2);
    uint8_t *xq = malloc((size_t)T * H), *aqc = malloc((size_t)P * I);
    uint16_t *gud = malloc((size_t)P * 2 * I * 2); /* the device's gate|up rows: what its codes encode */
    CK(cudaMemcpy(sel, d_sel, (size_t)P * 4, cudaMemcpyDeviceToHost));
    CK(cudaMemcpy(wt, d_wt, (size_t)P * 4, cudaMemcpyDeviceToHost));
    CK(cudaMemcpy(r, d_r, (size_t)T * H * 2, cudaMemcpyDeviceToHost));
    if (!gemv) CK(cudaMemcpy(inv, d_inv, (size_t)P * 4, cudaMemcpyDeviceToHost));
    if (aq) {
        CK(cudaMemcpy(xq, d_xq, (size_t)T * H, cudaMemcpyDeviceToHost));
        CK(cudaMemcpy(xsx, d_xsx, (size_t)T * 4, cudaMemcpyDeviceToHost));
        CK(cudaMemcpy(aqc, d_aq, (size_t)P * I, cudaMemcpyDeviceToHost));
        CK(cudaMemcpy(gud, d_gu, (size_t)P * 2 * I * 2, cudaMemcpyDeviceToHost));
        CK(cudaMemcpy(asx, d_asx, (size_t)P * 4, cudaMemcpyDeviceToHost));
    }
#define MQ_CODE(c) (aq == 2 ? e4m3_dec(c) : (double)(int8_t)(c))
    double *xin = malloc((size_t)H * 8), *gu = malloc((size_t)2 * I * 8), *act = malloc((size_t)I * 8);
    double *actref = malloc((size_t)I * 8), *ref = malloc((size_t)H * 8), *out = malloc((size_t)H * 8);
    double *xr = malloc((size_t)H * 8);
    err_acc a = {0};
    long cbad = 0, cn = 0; /* activation codes outside their bound (mq_codes_bad) */
    for (int t = 0; t < T; t++) {
        for (int k = 0; k < H; k++) {
            xr[k] = xf[(size_t)t * H + k];
            xin[k] = aq ? MQ_CODE(xq[(size_t)t * H + k]) * xsx[t] : xr[k];
        }
        if (aq) cbad += mq_codes_bad(aq, xin, xr, H, xsx[t], 0.0), cn += H;
        for (int h = 0; h < H; h++) ref[h] = 0;
        for (int j = 0; j < K; j++) {
            const int p = t * K + j, e = selg[p]; /* the whole model's number */
            const bool mine = e >= e0 && e < e0 + el;
            if (e < 0 || e >= E || sel[p] != (mine ? e - e0 : -1)) {
                a.nan = true;
                continue;
            }
            if (!mine) continue; /* another rank's share */
            for (int n = 0; n < 2 * I; n++) {
                double s = 0;
                const double *w = wgu + ((size_t)e * 2 * I + n) * H;
                for (int k = 0; k < H; k++) s += xin[k] * w[k];
                gu[n] = from16(dt, to16(dt, (float)s));
            }
            for (int i = 0; i < I; i++) actref[i] = from16(dt, to16(dt, (float)(gu[i] / (1.0 + exp(-gu[i])) * gu[I + i])));
            const int row = gemv ? p : inv[p];
            if (aq) {
                /* the codes encode silu(g) u of the device's own gate|up row,
                 * rounded to dt: formed here in double, one dt rounding may
                 * land the other way than the device's float one */
                const uint16_t *gr = gud + (size_t)row * 2 * I;
                for (int i = 0; i < I; i++) {
                    const double gg = from16(dt, gr[i]), uu = from16(dt, gr[I + i]);
                    actref[i] = from16(dt, to16(dt, (float)(gg / (1.0 + exp(-gg)) * uu)));
                    act[i] = MQ_CODE(aqc[(size_t)row * I + i]) * asx[row];
                }
                cbad += mq_codes_bad(aq, act, actref, I, asx[row], 0x1p-7), cn += I;
            } else {
                memcpy(act, actref, (size_t)I * 8);
            }
            for (int h = 0; h < H; h++) {
                double s = 0;
                const double *w = wdn + ((size_t)e * H + h) * I;
                for (int i = 0; i < I; i++) s += act[i] * w[i];
                ref[h] += wt[p] * from16(dt, to16(dt, (float)s));
            }
        }
        for (int h = 0; h < H; h++) out[h] = from16(dt, r[(size_t)t * H + h]);
        err_row(&a, out, ref, H);
    }
#undef MQ_CODE
    static const char *const modes[4] = {"uniform", "ties", "one-expert", "idle-experts"};
    char name[160], gs[16] = "", rk[32] = "";
    if (f == LOOM_CUDA_Q_INT4) snprintf(gs, sizeof gs, "-g%d", g);
    if (ranks > 1) snprintf(rk, sizeof rk, " rank %d/%d", rank, ranks);
    snprintf(name, sizeof name, "moe qffn %s %s%s %s T=%d E=%d K=%d I=%d H=%d %s%s", dtn(dt), qfn(f), gs,
             gemv ? "gemv" : "grouped", T, E, K, I, H, modes[mode], rk);
    report(name, &a, TOL16);
    if (aq) {
        snprintf(name, sizeof name, "moe qffn %s %s activation codes T=%d K=%d (bad of %ld)", dtn(dt), qfn(f), T, K,
                 cn);
        report_count(name, cbad, cn);
    }
    void *dv[] = {d_x, d_lg,  d_wt, d_sel, d_off, d_perm, d_inv, d_tiles, d_gu,
                  d_act, d_y, d_r, d_xq, d_aq, d_xsx, d_asx, d_selg};
    for (size_t i = 0; i < sizeof dv / sizeof dv[0]; i++) cudaFree(dv[i]);
    mq_free(&mgu), mq_free(&md);
    free(selg), free(xf), free(x), free(lg), free(sel), free(inv), free(wt), free(xsx), free(asx), free(r);
    free(xq), free(aqc), free(gud);
    free(xin), free(gu), free(act), free(actref), free(ref), free(out), free(xr);
}

/* The quantized expert kernels' argument checks: GGUF and unaligned
 * shapes refused with cudaErrorInvalidValue, nothing launched. */
static void test_moe_q_refused(void) {
    long bad = 0, n = 0;
    int32_t *d_sel = dev_poison(64);
    void *d_x = dev_poison(4096), *d_y = dev_poison(4096);
    const loom_cuda_qweight ws[4] = {
        {.fmt = LOOM_CUDA_Q_GGUF, .N = 64, .K = 64, .data = d_x, .scales = d_x},
        {.fmt = LOOM_CUDA_Q_INT8_W8A16, .N = 64, .K = 40, .data = d_x, .scales = d_x},
        {.fmt = LOOM_CUDA_Q_INT4, .N = 64, .K = 64, .group = 48, .data = d_x, .scales = d_x},
        {.fmt = LOOM_CUDA_Q_FP8, .N = 64, .K = 64, .data = d_x, .scales = d_x}, /* xq / sx missing */
    };
    for (int i = 0; i < 4; i++) {
        n += 2;
        bad += loom_cuda_moe_qgemv(LOOM_CUDA_BF16, d_x, NULL, NULL, 1, d_sel, &ws[i], 1, d_y, 0) != cudaErrorInvalidValue;
        bad += loom_cuda_moe_qgemm(LOOM_CUDA_BF16, d_x, NULL, NULL, NULL, 1, &ws[i], d_sel, 1, d_y, 0) !=
               cudaErrorInvalidValue;
    }
    (void)cudaGetLastError();
    report_count("moe quantized experts: bad formats / shapes refused", bad, n);
    cudaFree(d_sel), cudaFree(d_x), cudaFree(d_y);
}

static void test_moe_q_all(void) {
    static const loom_cuda_qfmt fs[4] = {LOOM_CUDA_Q_INT8_W8A16, LOOM_CUDA_Q_INT8_W8A8, LOOM_CUDA_Q_FP8,
                                         LOOM_CUDA_Q_INT4};
    for (int fi = 0; fi < 4; fi++)
        for (int gemv = 0; gemv < 2; gemv++) {
            const loom_cuda_qfmt f = fs[fi];
            test_moe_qffn(LOOM_CUDA_BF16, f, 1, 8, 2, 256, 128, 64, 0, gemv, 1, 0);
            test_moe_qffn(LOOM_CUDA_BF16, f, 3, 16, 8, 64, 64, 32, 1, gemv, 1, 0);
            test_moe_qffn(LOOM_CUDA_BF16, f, 17, 8, 1, 96, 256, 32, 2, gemv, 1, 0);
            test_moe_qffn(LOOM_CUDA_BF16, f, 300, 8, 2, 128, 64, 64, 3, gemv, 1, 0);
            test_moe_qffn(LOOM_CUDA_BF16, f, 130, 60, 4, 256, 128, 128, 0, gemv, 1, 0);
            test_moe_qffn(LOOM_CUDA_F16, f, 37, 16, 4, 64, 128, 32, 0, gemv, 1, 0);
        }
    test_moe_qffn(LOOM_CUDA_BF16, LOOM_CUDA_Q_INT8_W8A16, 64, 8, 2, 1024, 512, 0, 0, false, 1, 0);
    test_moe_qffn(LOOM_CUDA_BF16, LOOM_CUDA_Q_FP8, 64, 8, 2, 1024, 512, 0, 0, false, 1, 0);
    test_moe_qffn(LOOM_CUDA_BF16, LOOM_CUDA_Q_INT4, 64, 8, 2, 1024, 512, 128, 0, false, 1, 0);
    for (int fi = 0; fi < 4; fi++)
        for (int gemv = 0; gemv < 2; gemv++) { /* expert parallelism (test_moe_all's) */
            test_moe_qffn(LOOM_CUDA_BF16, fs[fi], 3, 16, 8, 64, 64, 32, 1, gemv, 2, 1);
            test_moe_qffn(LOOM_CUDA_BF16, fs[fi], 130, 60, 4, 256, 128, 128, 0, gemv, 4, 2);
        }
    test_moe_q_refused();
}

static void test_moe_all(void) {
    static const int ks[3] = {1, 2, 8};
    for (int mode = 0; mode < 4; mode++)
        for (int ki = 0; ki < 3; ki++) {
            test_moe_route(300, 8 * ki + 8, ks[ki], true, mode);
            test_moe_route(37, 128, ks[ki], ki != 1, mode);
        }
    test_moe_route(5, 256, 8, true, 0);
    test_moe_route(64, 60, 4, false, 1);
    for (int mode = 0; mode < 4; mode++)
        for (int bm = 64; bm <= 128; bm += 64) {
            test_moe_group(1, 8, mode, bm);
            test_moe_group(600, 8, mode, bm);
            test_moe_group(2400, 128, mode, bm);
            test_moe_group(8192 * 8, 128, mode, bm);
        }
    test_moe_pack(1, 8, 1);
    test_moe_pack(300, 64, 2);
    test_moe_pack(4096, 2048, 8);
    const loom_cuda_dt dts[2] = {LOOM_CUDA_BF16, LOOM_CUDA_F16};
    for (int di = 0; di < 2; di++)
        for (int gemv = 0; gemv < 5; gemv++) {
            const loom_cuda_dt dt = dts[di];
            test_moe_ffn(dt, 1, 8, 2, 256, 128, 0, 0, gemv, 1, 0);
            test_moe_ffn(dt, 3, 16, 8, 64, 72, 48, 1, gemv, 1, 0);
            test_moe_ffn(dt, 17, 8, 1, 40, 200, 0, 2, gemv, 1, 0);
            test_moe_ffn(dt, 300, 8, 2, 136, 64, 32, 3, gemv, 1, 0);
            test_moe_ffn(dt, 130, 60, 4, 96, 256, 0, 0, gemv, 1, 0);
            test_moe_ffn(dt, 2, 128, 8, 768, 2048, 0, 1, gemv, 1, 0); /* Qwen3-30B-A3B's widths */
            /* hidden 776: the gate|up GEMV's rounds of four chunks a lane end
             * part-way, lane 0 with a fourth chunk the others lack */
            test_moe_ffn(dt, 5, 16, 4, 64, 776, 0, 0, gemv, 1, 0);
        }
    /* several 64- and 128-row tiles an expert; widths past the wgmma
     * kernel's 256 columns and 64-column stages by a part (gate|up N 400 K
     * 328, down N 328 K 200); 700 tokens of top-2 over 4 experts: about
     * 350 rows an expert, two full 128-row tiles and a ragged third */
    for (int gemv = 0; gemv < 5; gemv += gemv ? 1 : 3) {
        test_moe_ffn(LOOM_CUDA_BF16, 64, 8, 2, 1024, 512, 0, 0, gemv, 1, 0);
        test_moe_ffn(LOOM_CUDA_BF16, 300, 4, 2, 200, 328, 0, 0, gemv, 1, 0);
        test_moe_ffn(LOOM_CUDA_F16, 300, 4, 2, 200, 328, 0, 1, gemv, 1, 0);
        test_moe_ffn(LOOM_CUDA_BF16, 700, 4, 2, 200, 328, 0, 0, gemv, 1, 0);
    }
    /* expert parallelism: each rank's share, every path. Idle-experts mode
     * over 2 ranks gives rank 0 every choice and rank 1 none (only zeros
     * to write); 12 of 16 experts a token over 2 ranks leave each rank 4..8
     * of a token's slots, so the fused combine's warps (6 slots each) meet
     * masks of 4 and more with other ranks' slots between them */
    for (int gemv = 0; gemv < 5; gemv++) {
        for (int r = 0; r < 2; r++) {
            test_moe_ffn(LOOM_CUDA_BF16, 3, 16, 8, 64, 72, 48, 1, gemv, 2, r);
            test_moe_ffn(LOOM_CUDA_BF16, 300, 8, 2, 136, 64, 32, 3, gemv, 2, r);
            test_moe_ffn(LOOM_CUDA_BF16, 5, 16, 12, 64, 128, 0, 0, gemv, 2, r);
        }
        test_moe_ffn(LOOM_CUDA_F16, 130, 60, 4, 96, 256, 0, 0, gemv, 4, 2);
        test_moe_ffn(LOOM_CUDA_BF16, 2, 128, 8, 768, 2048, 0, 0, gemv, 4, 3); /* Qwen3-30B-A3B over 4 */
    }
    test_moe_q_all();
}

/* ------------------------------------------------------------ logits top-k */

/* A row's top-k and log-sum-exp must not depend on how many rows share the
 * call (every pass's split depends on V alone): rows reduced together vs each
 * alone, bit for bit. */
static void test_logits_topk_invariance(int rows, int V, int k) {
    const size_t n = (size_t)rows * V;
    float *x = malloc(n * sizeof *x);
    for (size_t i = 0; i < n; i++) x[i] = gpu_rng_unif(-20, 20);
    float *dx = dev_upload(x, n * sizeof *x);
    int32_t *dids = dev_poison((size_t)rows * k * 4);
    float *dvals = dev_poison((size_t)rows * k * 4), *dlse = dev_poison((size_t)rows * 4);
    void *ws = dev_poison(loom_cuda_topk_ws_bytes(rows, V, k));
    const size_t bytes = (size_t)rows * k * 4;
    int32_t *ids[2] = {malloc(bytes), malloc(bytes)};
    float *vals[2] = {malloc(bytes), malloc(bytes)}, *lse[2] = {malloc((size_t)rows * 4), malloc((size_t)rows * 4)};
    for (int pass = 0; pass < 2; pass++) { /* 0: each row alone, 1: all together */
        if (pass == 0)
            for (int r = 0; r < rows; r++)
                CK(loom_cuda_logits_topk(dx + (size_t)r * V, 1, V, k, NULL, NULL, dids + (size_t)r * k, dvals + (size_t)r * k,
                                         dlse + r, ws, 0));
        else CK(loom_cuda_logits_topk(dx, rows, V, k, NULL, NULL, dids, dvals, dlse, ws, 0));
        CK(cudaDeviceSynchronize());
        CK(cudaMemcpy(ids[pass], dids, bytes, cudaMemcpyDeviceToHost));
        CK(cudaMemcpy(vals[pass], dvals, bytes, cudaMemcpyDeviceToHost));
        CK(cudaMemcpy(lse[pass], dlse, (size_t)rows * 4, cudaMemcpyDeviceToHost));
    }
    const long d = bits_differ(ids[0], ids[1], (size_t)rows * k, 4) +
                   bits_differ(vals[0], vals[1], (size_t)rows * k, 4) +
                   bits_differ(lse[0], lse[1], (size_t)rows, 4) +
                   count_nan(LOOM_CUDA_BF16, lse[0], (size_t)rows, 4);
    char name[128];
    snprintf(name, sizeof name, "logits_topk invariant rows %d V %d k %d: alone = together", rows, V, k);
    report_bits(name, d, rows);
    cudaFree(dx), cudaFree(dids), cudaFree(dvals), cudaFree(dlse), cudaFree(ws);
    free(x), free(ids[0]), free(ids[1]), free(vals[0]), free(vals[1]), free(lse[0]), free(lse[1]);
}

/* Constraint masks for test_logits_topk (words (V + 31) / 32 per row):
 * row 0 unmasked (flag clear), row 1 every token allowed, row 2 fewer
 * tokens than k allowed (the rest of its top k are forbidden tokens at
 * -inf), the others a random third of the vocabulary. */
static void topk_masks(int rows, int V, int k, uint32_t *bits, uint8_t *has) {
    const int W = (V + 31) / 32;
    memset(bits, 0, (size_t)rows * W * 4);
    for (int r = 0; r < rows; r++) {
        has[r] = r != 0;
        uint32_t *m = bits + (size_t)r * W;
        for (int v = 0; v < V; v++) {
            const bool on = r == 1 || (r == 2 ? v % (V / (k > 1 ? k / 2 + 1 : 1) + 1) == 3 : rng_int(3) == 0);
            if (on) m[v >> 5] |= 1u << (v & 31);
        }
    }
}

/* loom_cuda_logits_topk against loom/logits_topk.h on rows with many ties
 * (values on a coarse grid), NaNs and -inf; ids and values exactly, lse
 * to float rounding. Masked: the reference ranks a masked copy of the row
 * and takes lse from the raw row. */
static void test_logits_topk(int rows, int V, int k, bool masked) {
    const size_t n = (size_t)rows * V;
    float *x = malloc(n * sizeof *x);
    for (size_t i = 0; i < n; i++) {
        int u = rng_int(1000);
        x[i] = (float)(rng_int(161) - 80) * 0.125f;
        if (u == 0) x[i] = NAN;
        else if (u == 1) x[i] = -INFINITY;
    }
    if (rows > 1) /* a row with nothing finite but one value */
        for (int v = 0; v < V; v++) x[(size_t)V + v] = v == V / 2 ? 3.0f : -INFINITY;
    float *dx = dev_upload(x, n * sizeof *x);
    int32_t *dids = dev_poison((size_t)rows * k * 4);
    float *dvals = dev_poison((size_t)rows * k * 4), *dlse = dev_poison((size_t)rows * 4);
    void *ws = dev_poison(loom_cuda_topk_ws_bytes(rows, V, k));
    const int W = (V + 31) / 32;
    uint32_t *bits = masked ? malloc((size_t)rows * W * 4) : NULL;
    uint8_t *has = masked ? malloc((size_t)rows) : NULL;
    if (masked) topk_masks(rows, V, k, bits, has);
    uint32_t *dbits = masked ? dev_upload(bits, (size_t)rows * W * 4) : NULL;
    uint8_t *dhas = masked ? dev_upload(has, (size_t)rows) : NULL;
    CK(loom_cuda_logits_topk(dx, rows, V, k, dbits, dhas, dids, dvals, dlse, ws, 0));
    CK(cudaDeviceSynchronize());
    int32_t *ids = malloc((size_t)rows * k * 4), *rid = malloc((size_t)k * 4);
    float *vals = malloc((size_t)rows * k * 4), *lse = malloc((size_t)rows * 4), *rval = malloc((size_t)k * 4);
    float *mrow = malloc((size_t)V * sizeof *mrow);
    CK(cudaMemcpy(ids, dids, (size_t)rows * k * 4, cudaMemcpyDeviceToHost));
    CK(cudaMemcpy(vals, dvals, (size_t)rows * k * 4, cudaMemcpyDeviceToHost));
    CK(cudaMemcpy(lse, dlse, (size_t)rows * 4, cudaMemcpyDeviceToHost));
    long bad = 0;
    double worst = 0;
    for (int r = 0; r < rows; r++) {
        float rl, ml;
        const float *row = x + (size_t)r * V;
        loom_logits_topk_row(row, V, k, rid, rval, &rl);
        if (masked && has[r]) {
            const uint32_t *m = bits + (size_t)r * W;
            for (int v = 0; v < V; v++) mrow[v] = (m[v >> 5] >> (v & 31)) & 1u ? row[v] : -INFINITY;
            loom_logits_topk_row(mrow, V, k, rid, rval, &ml);
        }
        for (int j = 0; j < k; j++)
            if (ids[(size_t)r * k + j] != rid[j] || !(vals[(size_t)r * k + j] == rval[j] ||
                                                      (isinf(rval[j]) && vals[(size_t)r * k + j] == rval[j])))
                bad++;
        double e = fabs((double)lse[r] - rl) / (fabs(rl) > 1 ? fabs(rl) : 1);
        if (!(e <= worst)) worst = e;
    }
    char name[128];
    const char *mk = masked ? " masked" : "";
    snprintf(name, sizeof name, "logits_topk%s rows %d V %d k %d: ids/values", mk, rows, V, k);
    err_acc a = {.worst = (double)bad, .rows = rows};
    report(name, &a, 0.0);
    snprintf(name, sizeof name, "logits_topk%s rows %d V %d k %d: lse of the raw row", mk, rows, V, k);
    err_acc b = {.worst = worst, .rows = rows};
    report(name, &b, 1e-5);
    cudaFree(dx), cudaFree(dids), cudaFree(dvals), cudaFree(dlse), cudaFree(ws), cudaFree(dbits), cudaFree(dhas);
    free(x), free(ids), free(rid), free(vals), free(lse), free(rval), free(mrow), free(bits), free(has);
}

/* ------------------------------------------------- attention case tables */

/* The six-sequence batch most attention cases run: contexts at and around
 * block boundaries, queried as a prefill, a decode, or a chunked prefill /
 * verify step; and the two-sequence long batch (split-K decode, verify). */
static const int k_att_ctx[6] = {1, 15, 16, 17, 33, 1000};
static const int k_att_nq[3][6] = {{1, 15, 16, 17, 33, 1000}, {1, 1, 1, 1, 1, 1},
                                   {1, 5, 16, 1, 20, 300}};
static const int k_att_lctx[2] = {32768, 20001};
static const int k_att_lnq[2][2] = {{1, 1}, {4, 3}};
enum { ATT_PREFILL, ATT_DECODE, ATT_CHUNK, ATT_LONG_DECODE, ATT_LONG_VERIFY };

/* One test_attention call on one of those batches (ATT_*). */
typedef struct att_case {
    const char *label;
    loom_cuda_dt dt;
    int D, H, KVH, bs, batch;
    int shape_mode, splits; /* test_attention's shape_mode, max_splits_req */
} att_case;

#define BF LOOM_CUDA_BF16
#define HF LOOM_CUDA_F16
/* a dt KV cache: forced shapes and split counts, block sizes, head dims, long contexts */
static const att_case k_att_dt[] = {
    {"decode nosplit", BF, 128, 32, 8, 16, ATT_DECODE, -1, 1},
    {"decode split64", BF, 128, 32, 8, 16, ATT_DECODE, -1, 64},
    {"decode as prefill", BF, 128, 32, 8, 16, ATT_DECODE, 1, 0},
    {"chunk as prefill split7", BF, 64, 9, 3, 16, ATT_CHUNK, 1, 7},
    {"prefill f16", HF, 128, 32, 8, 16, ATT_CHUNK, -1, 0},
    {"decode f16", HF, 64, 8, 2, 16, ATT_DECODE, -1, 0},
    {"bs1", BF, 64, 4, 2, 1, ATT_CHUNK, -1, 0},
    {"bs7", BF, 128, 8, 8, 7, ATT_CHUNK, -1, 0},
    {"bs32", BF, 64, 12, 4, 32, ATT_CHUNK, -1, 0},
    {"D32", BF, 32, 8, 2, 16, ATT_CHUNK, -1, 0},
    {"D16", BF, 16, 4, 2, 16, ATT_CHUNK, -1, 0},
    {"MQA G16", BF, 64, 16, 1, 16, ATT_CHUNK, -1, 0},
    {"MQA G32", BF, 64, 32, 1, 16, ATT_DECODE, -1, 0},
    {"long decode", BF, 128, 32, 8, 16, ATT_LONG_DECODE, -1, 0},
    {"long decode", BF, 64, 9, 3, 16, ATT_LONG_DECODE, -1, 0},
    {"long verify", BF, 128, 32, 8, 16, ATT_LONG_VERIFY, -1, 0},
};
/* the batch-invariant mode (shape_mode 2) against float64 */
static const att_case k_att_invariant[] = {
    {"invariant", BF, 64, 9, 3, 16, ATT_CHUNK, 2, 0},
    {"invariant", BF, 128, 32, 8, 16, ATT_CHUNK, 2, 7},
    {"invariant", HF, 64, 8, 8, 16, ATT_DECODE, 2, 0},
    {"invariant MQA G32", BF, 64, 32, 1, 16, ATT_CHUNK, 2, 0},
    {"invariant long verify", BF, 128, 32, 8, 16, ATT_LONG_VERIFY, 2, 0},
};
/* an E4M3 KV cache: the same plans once more */
static const att_case k_att_e4m3[] = {
    {"decode nosplit", BF, 128, 32, 8, 16, ATT_DECODE, -1, 1},
    {"decode split64", BF, 128, 32, 8, 16, ATT_DECODE, -1, 64},
    {"decode as prefill", BF, 128, 32, 8, 16, ATT_DECODE, 1, 0},
    {"chunk as prefill split7", BF, 64, 9, 3, 16, ATT_CHUNK, 1, 7},
    {"prefill f16", HF, 128, 32, 8, 16, ATT_CHUNK, -1, 0},
    {"decode f16", HF, 64, 8, 2, 16, ATT_DECODE, -1, 0},
    {"bs1", BF, 64, 4, 2, 1, ATT_CHUNK, -1, 0},
    {"bs7", BF, 128, 8, 8, 7, ATT_CHUNK, -1, 0},
    {"D32", BF, 32, 8, 2, 16, ATT_CHUNK, -1, 0},
    {"D16", BF, 16, 4, 2, 16, ATT_CHUNK, -1, 0},
    {"D16 decode", BF, 16, 4, 2, 16, ATT_DECODE, -1, 0},
    {"D32 decode", BF, 32, 8, 2, 16, ATT_DECODE, -1, 0},
    {"decode f16 D128", HF, 128, 32, 8, 16, ATT_DECODE, -1, 0},
    {"bs7 decode", BF, 128, 8, 8, 7, ATT_DECODE, -1, 0},
    {"bs32 decode split7", BF, 64, 12, 4, 32, ATT_DECODE, -1, 7},
    {"decode G16 (all 16 rows)", BF, 128, 16, 1, 16, ATT_DECODE, -1, 0},
    {"decode G2 f16 split7", HF, 64, 8, 4, 16, ATT_DECODE, -1, 7},
    {"MQA G32", BF, 64, 32, 1, 16, ATT_DECODE, -1, 0},
    {"invariant", BF, 64, 9, 3, 16, ATT_CHUNK, 2, 0},
    {"invariant", BF, 128, 32, 8, 16, ATT_CHUNK, 2, 7},
    {"invariant MQA G32", BF, 64, 32, 1, 16, ATT_CHUNK, 2, 0},
    {"long decode", BF, 128, 32, 8, 16, ATT_LONG_DECODE, -1, 0},
    {"long verify", BF, 128, 32, 8, 16, ATT_LONG_VERIFY, -1, 0},
    {"invariant long verify", BF, 128, 32, 8, 16, ATT_LONG_VERIFY, 2, 0},
};
/* queries far from 1 (g_qexp): both shapes, split and not, long contexts */
static const att_case k_att_qrange[] = {
    {"decode", BF, 128, 32, 8, 16, ATT_DECODE, -1, 0},
    {"decode split7", BF, 64, 9, 3, 16, ATT_DECODE, -1, 7},
    {"long verify", BF, 128, 32, 8, 16, ATT_LONG_VERIFY, -1, 0},
    {"chunked", BF, 128, 32, 8, 16, ATT_CHUNK, -1, 0},
    {"invariant", BF, 128, 32, 8, 16, ATT_CHUNK, 2, 0},
};
/* the sink data (g_sink): decode and prefill shapes, split and not */
static const att_case k_att_sink[] = {
    {"decode", BF, 128, 32, 8, 16, ATT_LONG_DECODE, -1, 0},
    {"decode", HF, 128, 32, 8, 16, ATT_LONG_DECODE, -1, 0},
    {"decode split7", BF, 64, 9, 3, 16, ATT_LONG_DECODE, -1, 7},
    {"long verify", BF, 128, 32, 8, 16, ATT_LONG_VERIFY, -1, 0},
};
#undef BF
#undef HF

static void att_run(const att_case *c, int n) {
    for (int i = 0; i < n; i++) {
        const bool lng = c[i].batch >= ATT_LONG_DECODE;
        test_attention(c[i].label, c[i].dt, c[i].D, c[i].H, c[i].KVH, c[i].bs, lng ? 2 : 6,
                       lng ? k_att_lctx : k_att_ctx,
                       lng ? k_att_lnq[c[i].batch - ATT_LONG_DECODE] : k_att_nq[c[i].batch],
                       c[i].shape_mode, c[i].splits);
    }
}

/* Prefill, decode and chunked batches at head dims 64 and 128 for each
 * (H, KVH) of gqa[n]. */
static void att_grid(const int (*gqa)[2], int n) {
    static const char *const names[3] = {"prefill", "decode", "chunked"};
    for (int di = 0; di < 2; di++)
        for (int gi = 0; gi < n; gi++)
            for (int b = ATT_PREFILL; b <= ATT_CHUNK; b++)
                test_attention(names[b], LOOM_CUDA_BF16, di ? 128 : 64, gqa[gi][0], gqa[gi][1], 16, 6,
                               k_att_ctx, k_att_nq[b], -1, 0);
}

/* Head dim 256 (Gemma 3: 4 query heads, 1 KV head; 8/2 too) and sliding
 * windows (Gemma 3's local layers) at head dims 256, 128 and 64: every
 * batch shape, forced shapes and splits, long contexts (the window then
 * bounds what a split reads), the batch-invariant call, windows shorter
 * than a block and not a block multiple; dt and E4M3 caches. */
static const att_case k_att_gemma[] = {
    {"D256 MQA G4 prefill", LOOM_CUDA_BF16, 256, 4, 1, 16, ATT_PREFILL, -1, 0},
    {"D256 MQA G4 decode", LOOM_CUDA_BF16, 256, 4, 1, 16, ATT_DECODE, -1, 0},
    {"D256 MQA G4 chunked", LOOM_CUDA_BF16, 256, 4, 1, 16, ATT_CHUNK, -1, 0},
    {"D256 G4 decode split64", LOOM_CUDA_BF16, 256, 8, 2, 16, ATT_DECODE, -1, 64},
    {"D256 G4 decode as prefill", LOOM_CUDA_BF16, 256, 8, 2, 16, ATT_DECODE, 1, 0},
    {"D256 f16 chunked split7", LOOM_CUDA_F16, 256, 8, 2, 16, ATT_CHUNK, -1, 7},
    {"D256 long decode", LOOM_CUDA_BF16, 256, 4, 1, 16, ATT_LONG_DECODE, -1, 0},
    {"D256 long verify", LOOM_CUDA_BF16, 256, 8, 2, 16, ATT_LONG_VERIFY, -1, 0},
    {"D256 invariant", LOOM_CUDA_BF16, 256, 4, 1, 16, ATT_CHUNK, 2, 0},
    {"D128 chunked", LOOM_CUDA_BF16, 128, 32, 8, 16, ATT_CHUNK, -1, 0},
    {"D64 GQA3 decode", LOOM_CUDA_BF16, 64, 9, 3, 16, ATT_DECODE, -1, 0},
    {"D64 bs7 chunked", LOOM_CUDA_BF16, 64, 4, 2, 7, ATT_CHUNK, -1, 0},
};

static void test_attention_gemma(void) {
    const int wins[4] = {0, 37, 512, 5};
    for (int f8 = 0; f8 < 2; f8++) {
        g_kv = f8 ? LOOM_CUDA_KV_E4M3 : LOOM_CUDA_KV_DT;
        for (int w = 0; w < 4; w++) {
            g_window = wins[w];
            /* the window 5 (shorter than a block) on a few cases only */
            att_run(k_att_gemma, w == 3 ? 3 : (int)(sizeof k_att_gemma / sizeof k_att_gemma[0]));
        }
        g_window = 37;
        test_attention_invariance(LOOM_CUDA_BF16, 256, 4, 1, 16, 1030, 5);
        test_attention_invariance(LOOM_CUDA_BF16, 64, 9, 3, 16, 300, 5);
        g_window = 0;
        test_attention_invariance(LOOM_CUDA_BF16, 256, 4, 1, 16, 1030, 5);
    }
    g_kv = LOOM_CUDA_KV_DT;
    g_window = 0;
}

/* Every attention case: dt caches, the batch-invariant mode, E4M3 caches. */
static void test_attention_all(void) {
    test_attention_gemma();
    /* attention: ragged prefill, block boundaries, GQA 1/3/4/8, D 64/128;
     * then forced shapes and split counts, other block sizes and head
     * dims, long contexts (split-K decode, a verify step) */
    att_grid((const int[][2]){{8, 8}, {9, 3}, {32, 8}, {32, 4}}, 4);
    att_run(k_att_dt, (int)(sizeof k_att_dt / sizeof k_att_dt[0]));
    {
        const int ctx1[1] = {32768}, nq64[1] = {64};
        test_attention("long chunk", LOOM_CUDA_BF16, 128, 8, 2, 16, 1, ctx1, nq64, -1, 0);
    }

    /* batch-invariant attention: against float64 (causal masking, GQA,
     * the prefill shape for G > 16), then bit for bit alone vs in a step at
     * block-boundary lengths and past one split chunk (64 keys; 1024 =
     * 16 splits x 64, above which the chunks grow) */
    att_run(k_att_invariant, (int)(sizeof k_att_invariant / sizeof k_att_invariant[0]));
    {
        const int kv[9] = {5, 16, 17, 64, 65, 129, 1024, 1030, 20001};
        for (int i = 0; i < 9; i++) {
            test_attention_invariance(LOOM_CUDA_BF16, 64, 9, 3, 16, kv[i], 5);
            test_attention_invariance(LOOM_CUDA_BF16, 128, 32, 8, 16, kv[i], 5);
        }
        test_attention_invariance(LOOM_CUDA_BF16, 128, 32, 8, 16, 4000, 8);
        test_attention_invariance(LOOM_CUDA_F16, 64, 8, 2, 16, 1030, 7);
        test_attention_invariance(LOOM_CUDA_BF16, 64, 32, 1, 16, 1030, 5); /* G 32: prefill shape */
        test_attention_invariance(LOOM_CUDA_BF16, 64, 4, 2, 7, 100, 5);    /* block size 7 */
    }

    /* an E4M3 KV cache: the same kernels read codes (half the bytes) and
     * convert them to dt (the prefill shape and head dims 16/32 through
     * shared memory, the decode shape at 64/128 in registers, under a
     * permuted head_dim); every shape, head dim, block
     * size, split plan and the batch-invariant call once more */
    g_kv = LOOM_CUDA_KV_E4M3;
    att_grid((const int[][2]){{9, 3}, {32, 8}}, 2);
    att_run(k_att_e4m3, (int)(sizeof k_att_e4m3 / sizeof k_att_e4m3[0]));
    {
        const int kv[4] = {17, 65, 1030, 20001};
        for (int i = 0; i < 4; i++) {
            test_attention_invariance(LOOM_CUDA_BF16, 64, 9, 3, 16, kv[i], 5);
            test_attention_invariance(LOOM_CUDA_BF16, 128, 32, 8, 16, kv[i], 5);
        }
        test_attention_invariance(LOOM_CUDA_F16, 64, 8, 2, 16, 1030, 7);
        test_attention_invariance(LOOM_CUDA_BF16, 64, 32, 1, 16, 1030, 5);
    }
    /* bf16 queries of 2^24 and 2^-24 times [-1, 1) (the scale divided by as
     * much): past f16's largest value and below its normal range, which the
     * E4M3 decode shape's f16 products must take exactly; dt caches, then
     * E4M3 */
    for (int f8 = 0; f8 < 2; f8++) {
        g_kv = f8 ? LOOM_CUDA_KV_E4M3 : LOOM_CUDA_KV_DT;
        for (int e = 0; e < 2; e++) {
            g_qexp = e ? -24 : 24;
            att_run(k_att_qrange, (int)(sizeof k_att_qrange / sizeof k_att_qrange[0]));
        }
    }
    g_qexp = 0;
    g_kv = LOOM_CUDA_KV_DT;
    /* a sink key and thousands of keys at ~2^-27 of its weight: their
     * total (the whole output) survives P's rounding, in both shapes, dt
     * and E4M3 caches, bf16 and f16 */
    g_sink = true;
    for (int f8 = 0; f8 < 2; f8++) {
        g_kv = f8 ? LOOM_CUDA_KV_E4M3 : LOOM_CUDA_KV_DT;
        att_run(k_att_sink, (int)(sizeof k_att_sink / sizeof k_att_sink[0]));
    }
    g_sink = false;
    g_kv = LOOM_CUDA_KV_DT;
}

int main(int argc, char **argv) {
    if (argc > 1 && (!strcmp(argv[1], "--help") || !strcmp(argv[1], "-h"))) {
        printf("usage: gpu_kernel_tests [SEED]\n"
               "  every CUDA kernel against a float64 CPU reference on fresh random inputs (needs a GPU);\n"
               "  SEED repeats a run (each run prints its own). LOOM_GPU_KERNEL_TESTS=linear: the\n"
               "  linear-layer tests only; =attention, =epilogue, =moe, =tiled, =topk: those only. Ends with 'N passed, N failed'; exit status: the failures (at most 255).\n");
        return 0;
    }
    uint64_t seed = argc > 1 ? strtoull(argv[1], NULL, 0) : (uint64_t)time(NULL);
    gpu_rng_seed(seed);
    struct cudaDeviceProp prop;
    CK(cudaGetDeviceProperties(&prop, 0));
    printf("gpu_kernel_tests: seed %llu, device %s (sm_%d%d, %d SMs)\n", (unsigned long long)seed,
           prop.name, prop.major, prop.minor, prop.multiProcessorCount);

    const loom_cuda_dt dts[2] = {LOOM_CUDA_BF16, LOOM_CUDA_F16};
    /* LOOM_GPU_KERNEL_TESTS=linear: only the linear layers (GEMV, cuBLASLt,
     * quantized, GGUF) — for a racecheck run that the attention tests
     * would otherwise fill with minutes of sanitizer time */
    /* =attention: the attention tests only (dt and E4M3 caches);
     * =epilogue: the GEMVs' pair-epilogue tests only (short device calls) */
    test_launch_order(); /* every subset: it takes no time */
    const char *only = getenv("LOOM_GPU_KERNEL_TESTS");
    const bool only_att = only && strcmp(only, "attention") == 0, only_epi = only && strcmp(only, "epilogue") == 0;
    if (only && strcmp(only, "moe") == 0) { /* =moe: the mixture-of-experts kernels only */
        printf("gpu_kernel_tests: LOOM_GPU_KERNEL_TESTS=moe: the mixture-of-experts tests only\n");
        test_moe_all();
        goto done;
    }
    const bool only_tiled = only && strcmp(only, "tiled") == 0; /* the tiled W8A16 / INT4 kernel only */
    if (only && (strcmp(only, "linear") == 0 || only_epi || only_tiled)) {
        printf("gpu_kernel_tests: LOOM_GPU_KERNEL_TESTS=%s: the %s tests only\n", only,
               only_epi ? "pair-epilogue" : only_tiled ? "tiled quantized-weight" : "linear-layer");
        goto linear;
    }
    if (only_att) {
        printf("gpu_kernel_tests: LOOM_GPU_KERNEL_TESTS=attention: the attention tests only\n");
        goto attention;
    }
    const bool only_topk = only && strcmp(only, "topk") == 0;
    if (only_topk) {
        printf("gpu_kernel_tests: LOOM_GPU_KERNEL_TESTS=topk: the logits top-k tests only\n");
        goto topk;
    }
    /* a few elementwise kernels with every kernel letting the next launch
     * before it waits (the cuda backend's trigger_first=true); the rest in
     * the default order */
    CK(loom_cuda_set_trigger_first(1));
    test_rmsnorm(LOOM_CUDA_BF16, 4096, 3, 1);
    test_swiglu(LOOM_CUDA_BF16, 4096, 5, false);
    test_add_normed(LOOM_CUDA_BF16, 4096, 3);
    CK(loom_cuda_set_trigger_first(0));
    test_embedding(LOOM_CUDA_BF16, 1000, 4096, 7, false);
    test_embedding(LOOM_CUDA_F16, 49152, 576, 3, false);
    test_embedding(LOOM_CUDA_BF16, 1000, 64, 9, true);
    for (int mode = 0; mode < 3; mode++) {
        test_rmsnorm(LOOM_CUDA_BF16, 4096, 1, mode);
        test_rmsnorm(LOOM_CUDA_BF16, 576, 33, mode);
        test_rmsnorm(LOOM_CUDA_F16, 8192, 5, mode);
        test_rmsnorm(LOOM_CUDA_BF16, 64, 3, mode);
    }
    test_swiglu(LOOM_CUDA_BF16, 14336, 3, false);
    test_swiglu(LOOM_CUDA_BF16, 1536, 17, false);
    test_swiglu(LOOM_CUDA_F16, 8, 2, false);
    test_swiglu(LOOM_CUDA_BF16, 2048, 5, true);
    test_swiglu(LOOM_CUDA_F16, 6912, 3, true);
    test_add_normed(LOOM_CUDA_BF16, 640, 9);
    test_add_normed(LOOM_CUDA_F16, 4096, 2);
    test_add_normed(LOOM_CUDA_BF16, 64, 1);
    test_moe_all();

    for (int f8 = 0; f8 < 2; f8++) { /* dt caches, then E4M3 */
        const loom_cuda_kv kv = f8 ? LOOM_CUDA_KV_E4M3 : LOOM_CUDA_KV_DT;
        test_rope_kv(LOOM_CUDA_BF16, kv, 32, 8, 128, 16, 37, false, true);
        test_rope_kv(LOOM_CUDA_BF16, kv, 9, 3, 64, 16, 20, false, false);
        test_rope_kv(LOOM_CUDA_BF16, kv, 14, 2, 64, 16, 11, true, false);
        test_rope_kv(LOOM_CUDA_F16, kv, 4, 2, 16, 8, 9, true, false);
        test_rope_kv(LOOM_CUDA_BF16, kv, 8, 1, 32, 32, 5, false, false);
    }
    for (int f8 = 0; f8 < 2; f8++) { /* QK-norm: Gemma 3 270M, Qwen3 heads, small dims */
        const loom_cuda_kv kv = f8 ? LOOM_CUDA_KV_E4M3 : LOOM_CUDA_KV_DT;
        test_rope_kv_norm(LOOM_CUDA_BF16, kv, 4, 1, 256, 19, false, true);
        test_rope_kv_norm(LOOM_CUDA_F16, kv, 8, 2, 256, 5, true, true);
        test_rope_kv_norm(LOOM_CUDA_BF16, kv, 16, 8, 128, 7, false, true);
        test_rope_kv_norm(LOOM_CUDA_BF16, kv, 9, 3, 64, 4, true, false);
        test_rope_kv_norm(LOOM_CUDA_BF16, kv, 4, 2, 16, 3, false, true);
        test_rope_kv_norm(LOOM_CUDA_BF16, kv, 32, 4, 128, 1, false, true); /* Qwen3-30B-A3B, a decode step */
        test_rope_kv_norm(LOOM_CUDA_BF16, kv, 32, 4, 128, 9, false, true);
    }
    test_rope_kv_e4m3_exact(LOOM_CUDA_BF16);
    test_rope_kv_e4m3_exact(LOOM_CUDA_F16);
    test_e4m3_decode(LOOM_CUDA_BF16);
    test_e4m3_decode(LOOM_CUDA_F16);

attention:;
    test_attention_all();
    if (only_att) goto done;

    test_copy_blocks(false);
    test_copy_blocks(true);

topk:;
    for (int masked = 0; masked < 2; masked++) {
        test_logits_topk(1, 1000, 1, masked);
        test_logits_topk(3, 49152, 1, masked);
        test_logits_topk(7, 49152, 20, masked);
        test_logits_topk(256, 128256, 1, masked);
        test_logits_topk(256, 128256, 64, masked);
        test_logits_topk(5, 151936, 64, masked);
        test_logits_topk(2, 70, 64, masked);
        test_logits_topk(4, 4096, 7, masked);
        test_logits_topk(3, 4097, 2, masked);
        test_logits_topk(2, 8193, 1, masked);   /* pass 1's last chunk: one logit */
        test_logits_topk(2, 262144, 1, masked); /* Gemma 3: 32 pass-1 chunks, the most */
    }
    test_logits_topk_invariance(7, 49152, 1);
    test_logits_topk_invariance(5, 128256, 1);
    test_logits_topk_invariance(7, 128256, 64);
    if (only_topk) goto done;

linear:;
    int code = 0;
    char msg[256] = "";
    loom_cuda_gemm *g = loom_cuda_gemm_create((size_t)32 << 20, &code, msg, sizeof msg);
    if (!g) {
        printf("FAIL gemm_create: %s\n", msg);
        g_fail++;
    } else if (only_tiled) {
        test_qgemm_tiled(g);
        loom_cuda_gemm_destroy(g);
    } else if (only_epi) {
        test_pair_epilogue(g);
        test_pair_epilogue_fallback(g);
        loom_cuda_gemm_destroy(g);
    } else {
        for (int di = 0; di < 2; di++) {
            /* M <= 8: the streaming GEMV; larger: cuBLASLt */
            for (int m = 1; m <= 8; m++) test_gemm(g, dts[di], m, 1000 + 8 * m, 576, m % 2);
            test_gemm(g, dts[di], 1, 4096, 14336, false);
            test_gemm(g, dts[di], 8, 6144, 4096, false);
            test_gemm(g, dts[di], 1, 4096, 4096, false);
            test_gemm(g, dts[di], 7, 6144, 4096, false);
            test_gemm(g, dts[di], 130, 576, 1536, false);
            test_gemm(g, dts[di], 3, 49152, 576, true);
        }
        test_gemm(g, LOOM_CUDA_BF16, 9, 4096, 4096, false); /* cached plan */
        for (int m = 1; m <= 9; m += 2) test_swiglu_down(g, LOOM_CUDA_BF16, m, 576, 1536);
        test_swiglu_down(g, LOOM_CUDA_BF16, 8, 4096, 14336);
        test_swiglu_down(g, LOOM_CUDA_F16, 2, 896, 4864);
        test_swiglu_down(g, LOOM_CUDA_BF16, 40, 576, 1536);
        loom_cuda_gemm_set_gemv_max_m(g, 0); /* cuBLASLt at M = 1 too */
        test_gemm(g, LOOM_CUDA_BF16, 1, 4096, 4096, false);
        test_gemm(g, LOOM_CUDA_BF16, 4, 49152, 576, true);
        loom_cuda_gemm_set_gemv_max_m(g, 8);
        /* batch-invariant linear layers: rows at M = 1 vs 5, 8, 13, Mmax */
        for (int di = 0; di < 2; di++) {
            test_gemm_invariance(g, dts[di], 1000, 576, false, 40);
            test_gemm_invariance(g, dts[di], 4097, 576, true, 21); /* LM head: float32 out */
        }
        test_gemm_invariance(g, LOOM_CUDA_BF16, 6144, 4096, false, 64);
        test_gemm_invariance(g, LOOM_CUDA_BF16, 576, 1536, false, 300);
        {
            const loom_cuda_qfmt qf[4] = {LOOM_CUDA_Q_INT8_W8A16, LOOM_CUDA_Q_INT8_W8A8, LOOM_CUDA_Q_FP8,
                                          LOOM_CUDA_Q_INT4};
            for (int i = 0; i < 4; i++) {
                test_qgemm_invariance(g, LOOM_CUDA_BF16, qf[i], 1001, 576, 64, false, 40);
                test_qgemm_invariance(g, LOOM_CUDA_F16, qf[i], 515, 1024, 128, true, 19);
            }
            /* W8A8 / FP8 past 128 rows, where the activation quantizer
             * takes its other thread layout: the same bits as one row */
            test_qgemm_invariance(g, LOOM_CUDA_BF16, LOOM_CUDA_Q_INT8_W8A8, 300, 1024, 0, false, 150);
            test_qgemm_invariance(g, LOOM_CUDA_BF16, LOOM_CUDA_Q_FP8, 300, 1024, 0, false, 150);
        }
        test_qgemm_all(g);
        test_qgemm_qmma(g);
        test_qgemm_tiled(g);
        test_qgemv_split(g);
        test_pair_epilogue(g);
        test_pair_epilogue_fallback(g);
        test_qgemm_scratch_bound(g);
        test_qgemm_gguf_all(g);
        loom_cuda_gemm_destroy(g);
    }
done:
    printf("gpu_kernel_tests: %d passed, %d failed (seed %llu)\n", g_pass, g_fail,
           (unsigned long long)seed);
    return g_fail > 255 ? 255 : g_fail;
}
