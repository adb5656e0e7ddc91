/*
 * bench/gpu/gpu_bench.c — speed of the cuda backend and its attention
 * kernel on one Hopper GPU, next to the ceilings measured in the same run.
 *
 *   gpu_bench OUT.json [loom-backend-cuda.so] [--quick] [--components] [--quant] [--attention]
 *
 * Ceilings (measured first): device-to-device cudaMemcpy bandwidth (bytes
 * read + written, 2 GiB buffers, PERF.md's convention) and a bf16 GEMM
 * 8192^3 through the same cuBLASLt path the backend uses.
 * Workloads (dummy bf16 weights from core/model's dummy loader):
 *   - Llama-3-8B batch-1 decode step at 512 tokens of context (CUDA graph),
 *     batch-64 decode step, and a 2048-token prefill;
 *   - SmolLM2-135M batch-1 decode step;
 *   - the four linear layers of one Llama-3-8B layer at M = 1, 64 and 2048
 *     in bf16 and in every quantized format (loom_cuda_qgemm_run; GGUF
 *     q4_0, q4_1, q4_k and q6_k blocks as stored among them), with the
 *     speed-up over bf16 (JSON: "quant_linears"; --quant runs only these);
 *   - paged decode attention alone (Llama-3-8B heads, 32k context, batch 1
 *     and 8; 256 tokens at batch 512, a throughput run's decode step;
 *     shuffled 16-token blocks), K/V bytes read per second; with a
 *     bf16 and with an FP8 E4M3 KV cache.
 * Step times are the host wall clock around forward() — which ends with a
 * sync of the backend's stream — medians after warm-up; kernel times are
 * CUDA events, medians. Each row gives bytes and FLOPs next to the time and
 * the ratio to the roofline of the limiting resource. Prints a table and
 * writes the numbers to OUT.json. Not a test; exit 0 unless something
 * failed.
 */
#include <dlfcn.h>
#include <math.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <cuda_runtime_api.h>

#include "cuda_kernels.h"
#include "qgemm.h" /* lc_gemm_set_fp8_vec, lc_qgemm_fp8_count: the FP8 GEMM's fallback for comparison */
#include "loom/backend.h"
#include "loom/quant.h"
#include "gpu_util.h"
#include "model/model.h"
#include "plugin/host.h"

#ifndef LOOM_CUDA_BACKEND_DEFAULT
#define LOOM_CUDA_BACKEND_DEFAULT "loom-backend-cuda.so"
#endif

#define CK(call)                                                                                   \
    do {                                                                                           \
        cudaError_t e_ = (call);                                                                   \
        if (e_ != cudaSuccess) {                                                                   \
            fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #call, cudaGetErrorString(e_)); \
            exit(1);                                                                               \
        }                                                                                          \
    } while (0)

static double now_s(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}
static int cmp_d(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}
static double median(double *v, int n) {
    qsort(v, (size_t)n, sizeof *v, cmp_d);
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

/* ----------------------------------------------------------------- results */

typedef struct row {
    char name[96];
    double ms;        /* median time                              */
    double bytes;     /* device bytes the work must move           */
    double flops;
    double per_s;     /* tokens/s, or 0                            */
    double ratio;     /* vs the limiting ceiling                   */
    const char *bound;/* "memory" or "compute"                     */
} row;

#define MAX_ROWS 256
static row g_rows[MAX_ROWS];
static int g_nrows;
static double g_copy_bw, g_gemm_flops; /* bytes/s, FLOP/s */

static void add_row(const char *name, double ms, double bytes, double flops, double per_s) {
    if (g_nrows == MAX_ROWS) {
        fprintf(stderr, "gpu_bench: more than %d result rows; '%s' and later left out of the JSON\n", MAX_ROWS, name);
        return;
    }
    row *r = &g_rows[g_nrows++];
    snprintf(r->name, sizeof r->name, "%s", name);
    r->ms = ms, r->bytes = bytes, r->flops = flops, r->per_s = per_s;
    double t_mem = bytes / g_copy_bw, t_cmp = g_gemm_flops > 0 ? flops / g_gemm_flops : 0;
    r->bound = t_mem >= t_cmp ? "memory" : "compute";
    r->ratio = (t_mem >= t_cmp ? t_mem : t_cmp) / (ms * 1e-3);
    printf("  %-44s %9.3f ms  %8.2f GB  %9.2f TFLOP  %5.1f%% of %s roofline%s", r->name, ms,
           bytes / 1e9, flops / 1e12, 100 * r->ratio, r->bound, per_s > 0 ? "" : "\n");
    if (per_s > 0) printf("  %.1f tok/s\n", per_s);
    fflush(stdout);
}

/* ---------------------------------------------------------------- ceilings */

static void measure_copy(void) {
    const size_t n = (size_t)2 << 30;
    void *a, *b;
    CK(cudaMalloc(&a, n));
    CK(cudaMalloc(&b, n));
    CK(cudaMemset(a, 1, n));
    cudaEvent_t e0, e1;
    CK(cudaEventCreate(&e0));
    CK(cudaEventCreate(&e1));
    double t[10];
    for (int i = -2; i < 10; i++) {
        CK(cudaEventRecord(e0, 0));
        CK(cudaMemcpyAsync(b, a, n, cudaMemcpyDeviceToDevice, 0));
        CK(cudaEventRecord(e1, 0));
        CK(cudaEventSynchronize(e1));
        float ms;
        CK(cudaEventElapsedTime(&ms, e0, e1));
        if (i >= 0) t[i] = ms;
    }
    double ms = median(t, 10);
    g_copy_bw = 2.0 * (double)n / (ms * 1e-3);
    printf("  %-44s %9.3f ms  %.0f GB/s (read + write)\n", "ceiling: D2D cudaMemcpy 2 GiB", ms,
           g_copy_bw / 1e9);
    cudaFree(a), cudaFree(b);
    cudaEventDestroy(e0), cudaEventDestroy(e1);
}

static void measure_gemm(void) {
    const int n = 8192;
    int code = 0;
    char msg[256] = "";
    loom_cuda_gemm *g = loom_cuda_gemm_create((size_t)32 << 20, &code, msg, sizeof msg);
    if (!g) {
        printf("  gemm ceiling: %s\n", msg);
        return;
    }
    void *x, *w, *y;
    CK(cudaMalloc(&x, (size_t)n * n * 2));
    CK(cudaMalloc(&w, (size_t)n * n * 2));
    CK(cudaMalloc(&y, (size_t)n * n * 2));
    /* random bits in a sane range: bf16 exponents near 1 (never time on zeros) */
    uint16_t *h = malloc((size_t)n * n * 2);
    uint64_t s = 12345;
    for (size_t i = 0; i < (size_t)n * n; i++) {
        s = s * 6364136223846793005ull + 1442695040888963407ull;
        h[i] = (uint16_t)(0x3c00u | ((s >> 33) & 0x83ffu)); /* +-[0.0078, 0.0156) */
    }
    CK(cudaMemcpy(x, h, (size_t)n * n * 2, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(w, h, (size_t)n * n * 2, cudaMemcpyHostToDevice));
    free(h);
    cudaEvent_t e0, e1;
    CK(cudaEventCreate(&e0));
    CK(cudaEventCreate(&e1));
    double t[10];
    for (int i = -2; i < 10; i++) {
        CK(cudaEventRecord(e0, 0));
        if (loom_cuda_gemm_run(g, LOOM_CUDA_BF16, 0, n, n, n, x, w, y, 0, msg, sizeof msg)) {
            printf("  gemm ceiling: %s\n", msg);
            break;
        }
        CK(cudaEventRecord(e1, 0));
        CK(cudaEventSynchronize(e1));
        float ms;
        CK(cudaEventElapsedTime(&ms, e0, e1));
        if (i >= 0) t[i] = ms;
    }
    double ms = median(t, 10);
    g_gemm_flops = 2.0 * n * (double)n * n / (ms * 1e-3);
    printf("  %-44s %9.3f ms  %.0f TFLOP/s\n", "ceiling: bf16 GEMM 8192^3 (cuBLASLt)", ms,
           g_gemm_flops / 1e12);
    cudaFree(x), cudaFree(w), cudaFree(y);
    cudaEventDestroy(e0), cudaEventDestroy(e1);
    loom_cuda_gemm_destroy(g);
}

/* ------------------------------------------------------- attention alone */

/* kv: the cache's element type (bf16, or E4M3 codes: half the bytes). */
static void bench_attention(int batch, int ctx, loom_cuda_kv kv) {
    const int H = 32, KVH = 8, D = 128, bs = 16, G = H / KVH;
    const int nb_seq = (ctx + bs - 1) / bs, nblk = nb_seq * batch;
    const size_t cache = (size_t)nblk * KVH * bs * D, elt = LOOM_CUDA_KV_ELT(kv);
    void *k, *v, *q, *o, *d_bt, *d_pos, *d_stride, *d_tiles;
    float *ws;
    CK(cudaMalloc(&k, cache * elt));
    CK(cudaMalloc(&v, cache * elt));
    uint16_t *h = malloc(cache * 2);
    uint64_t s = 777;
    for (size_t i = 0; i < cache; i++) {
        s = s * 6364136223846793005ull + 1442695040888963407ull;
        h[i] = (uint16_t)(0x3c00u | ((s >> 33) & 0x83ffu));
    }
    if (kv == LOOM_CUDA_KV_E4M3) { /* codes: +-[0.5, 2), no NaN */
        uint8_t *c8 = malloc(cache);
        for (size_t i = 0; i < cache; i++) c8[i] = (uint8_t)((h[i] >> 8 & 0x80u) | 0x30u | (h[i] & 0x0fu));
        memcpy(h, c8, cache);
        free(c8);
    }
    CK(cudaMemcpy(k, h, cache * elt, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(v, h, cache * elt, cudaMemcpyHostToDevice));
    free(h);
    CK(cudaMalloc(&q, (size_t)batch * (H + 2 * KVH) * D * 2));
    CK(cudaMemset(q, 0x3c, (size_t)batch * (H + 2 * KVH) * D * 2));
    CK(cudaMalloc(&o, (size_t)batch * H * D * 2));
    int32_t *bt = malloc((size_t)nblk * 4), *pos = malloc((size_t)batch * 4);
    for (int i = 0; i < nblk; i++) bt[i] = i;
    for (int i = nblk - 1; i > 0; i--) {
        s = s * 6364136223846793005ull + 1442695040888963407ull;
        int j = (int)((s >> 33) % (uint64_t)(i + 1)), t = bt[i];
        bt[i] = bt[j], bt[j] = t;
    }
    loom_cuda_attn_tile *tiles = malloc(sizeof *tiles * (size_t)batch);
    for (int b = 0; b < batch; b++) {
        pos[b] = ctx - 1;
        tiles[b] = (loom_cuda_attn_tile){b, b, 1, 0};
    }
    int stride = nb_seq;
    CK(cudaMalloc(&d_bt, (size_t)nblk * 4));
    CK(cudaMemcpy(d_bt, bt, (size_t)nblk * 4, cudaMemcpyHostToDevice));
    CK(cudaMalloc(&d_pos, (size_t)batch * 4));
    CK(cudaMemcpy(d_pos, pos, (size_t)batch * 4, cudaMemcpyHostToDevice));
    CK(cudaMalloc(&d_stride, 4));
    CK(cudaMemcpy(d_stride, &stride, 4, cudaMemcpyHostToDevice));
    CK(cudaMalloc(&d_tiles, sizeof *tiles * (size_t)batch));
    CK(cudaMemcpy(d_tiles, tiles, sizeof *tiles * (size_t)batch, cudaMemcpyHostToDevice));
    int sms = 132;
    cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0);
    int ms_split = loom_cuda_attn_max_splits(
        batch, KVH, sms * loom_cuda_attn_ctas_per_sm(LOOM_CUDA_BF16, kv, LOOM_CUDA_ATTN_DECODE, D));
    size_t wsf = loom_cuda_attn_workspace_floats(LOOM_CUDA_ATTN_DECODE, batch, KVH, D, ms_split);
    CK(cudaMalloc((void **)&ws, wsf * 4 + 16));
    int *sem;
    CK(cudaMalloc((void **)&sem, (size_t)batch * KVH * sizeof(int)));
    CK(cudaMemset(sem, 0, (size_t)batch * KVH * sizeof(int)));
    loom_cuda_attn_args a = {.dt = LOOM_CUDA_BF16, .kv = kv, .shape = LOOM_CUDA_ATTN_DECODE, .out = o,
                             .ldo = H * D, .q = q, .ldq = (H + 2 * KVH) * D, .k_cache = k,
                             .v_cache = v, .block_table = d_bt, .bt_stride = d_stride,
                             .positions = d_pos, .tiles = d_tiles, .num_tiles = batch,
                             .num_heads = H, .num_kv_heads = KVH, .head_dim = D, .block_size = bs,
                             .scale = 1.0f / sqrtf((float)D), .max_splits = ms_split,
                             .partial = ws, .sem = sem};
    cudaEvent_t e0, e1;
    CK(cudaEventCreate(&e0));
    CK(cudaEventCreate(&e1));
    double t[30];
    for (int i = -3; i < 30; i++) {
        CK(cudaEventRecord(e0, 0));
        CK(loom_cuda_attention(&a, 0));
        CK(cudaEventRecord(e1, 0));
        CK(cudaEventSynchronize(e1));
        float ms;
        CK(cudaEventElapsedTime(&ms, e0, e1));
        if (i >= 0) t[i] = ms;
    }
    double ms = median(t, 30);
    const double bytes = (double)batch * ctx * KVH * D * 2.0 * (double)elt;
    const double flops = (double)batch * ctx * H * D * 4.0;
    char name[96];
    snprintf(name, sizeof name, "decode attention%s b=%d ctx=%d (G=%d, splits<=%d)",
             kv == LOOM_CUDA_KV_E4M3 ? " e4m3-KV" : "", batch, ctx, G, ms_split);
    add_row(name, ms, bytes, flops, 0);
    printf("      K/V read %.0f GB/s = %.1f%% of the D2D copy bandwidth\n", bytes / (ms * 1e-3) / 1e9,
           100.0 * bytes / (ms * 1e-3) / g_copy_bw);
    cudaFree(k), cudaFree(v), cudaFree(q), cudaFree(o), cudaFree(d_bt), cudaFree(d_pos);
    cudaFree(d_stride), cudaFree(d_tiles), cudaFree(ws), cudaFree(sem);
    cudaEventDestroy(e0), cudaEventDestroy(e1);
    free(bt), free(pos), free(tiles);
}

/* ------------------------------------------------ per-kernel breakdown */

/* Median time (ms) of `fn` over `n` runs after 3 warm-ups, CUDA events. */
typedef void (*op_fn)(void *ctx);
static double time_op(op_fn fn, void *ctx, int n) {
    cudaEvent_t e0, e1;
    CK(cudaEventCreate(&e0));
    CK(cudaEventCreate(&e1));
    /* LOOM_BENCH_REPS=n: n timed runs after one warm-up (few launches to
     * profile under ncu) */
    const char *e = getenv("LOOM_BENCH_REPS");
    const int reps = e ? atoi(e) : 0, warm = reps > 0 ? 1 : 3;
    if (reps > 0) n = reps;
    double *t = malloc(sizeof(double) * (size_t)n);
    for (int i = -warm; i < n; i++) {
        CK(cudaEventRecord(e0, 0));
        fn(ctx);
        CK(cudaEventRecord(e1, 0));
        CK(cudaEventSynchronize(e1));
        float ms;
        CK(cudaEventElapsedTime(&ms, e0, e1));
        if (i >= 0) t[i] = ms;
    }
    double m = median(t, n);
    free(t);
    cudaEventDestroy(e0), cudaEventDestroy(e1);
    return m;
}

typedef struct comp_ctx {
    loom_cuda_gemm *g;
    int M, N, K;
    void *x, *w, *y;
    int out_f32;
    /* element-wise */
    float *xf, *wn, *cs;
    void *r, *yn, *gu, *act, *qkv, *kc, *vc;
    int32_t *pos, *rows;
    int64_t *slot;
    int T, H, I, NH, KVH, D;
    loom_cuda_attn_args aa;
} comp_ctx;

static void op_gemm(void *p) {
    comp_ctx *c = p;
    char msg[128];
    if (loom_cuda_gemm_run(c->g, LOOM_CUDA_BF16, c->out_f32, c->M, c->N, c->K, c->x, c->w, c->y, 0,
                           msg, sizeof msg))
        fprintf(stderr, "gemm: %s\n", msg);
}
static void op_norm(void *p) {
    comp_ctx *c = p;
    CK(loom_cuda_add_rmsnorm(LOOM_CUDA_BF16, c->yn, c->xf, c->r, c->wn, NULL, c->T, c->H, 1e-5f, 0));
}
static void op_swiglu(void *p) {
    comp_ctx *c = p;
    CK(loom_cuda_swiglu(LOOM_CUDA_BF16, c->act, c->gu, c->T, c->I, 0));
}
static void op_rope(void *p) {
    comp_ctx *c = p;
    CK(loom_cuda_rope_kv(LOOM_CUDA_BF16, LOOM_CUDA_KV_DT, c->qkv, (c->NH + 2 * c->KVH) * c->D, NULL, c->cs, c->pos,
                         c->slot, c->kc, c->vc, c->T, c->NH, c->KVH, c->D, 16, 0));
}
static void op_attn(void *p) {
    comp_ctx *c = p;
    CK(loom_cuda_attention(&c->aa, 0));
}

static void *dev_rand(size_t n16) { /* n16 random bf16 in +-[0.0078, 0.0156) */
    uint16_t *h = malloc(n16 * 2);
    uint64_t s = n16 * 2654435761u + 1;
    for (size_t i = 0; i < n16; i++) {
        s = s * 6364136223846793005ull + 1442695040888963407ull;
        h[i] = (uint16_t)(0x3c00u | ((s >> 33) & 0x83ffu));
    }
    void *d;
    CK(cudaMalloc(&d, n16 * 2 + 16));
    CK(cudaMemcpy(d, h, n16 * 2, cudaMemcpyHostToDevice));
    free(h);
    return d;
}

/* Median time (ms) of 15 replays of graph gr on stream st after 2
 * warm-ups, CUDA events around each launch. */
static double graph_ms(cudaGraph_t gr, cudaStream_t st) {
    cudaGraphExec_t ex;
    CK(cudaGraphInstantiate(&ex, gr, 0));
    cudaEvent_t e0, e1;
    CK(cudaEventCreate(&e0));
    CK(cudaEventCreate(&e1));
    double t[15];
    for (int i = -2; i < 15; i++) {
        CK(cudaEventRecord(e0, st));
        CK(cudaGraphLaunch(ex, st));
        CK(cudaEventRecord(e1, st));
        CK(cudaEventSynchronize(e1));
        float ms;
        CK(cudaEventElapsedTime(&ms, e0, e1));
        if (i >= 0) t[i] = ms;
    }
    cudaEventDestroy(e0), cudaEventDestroy(e1);
    cudaGraphExecDestroy(ex);
    return median(t, 15);
}

/* ------------------------------------------------ quantized linears */

/* One Llama-3-8B layer's four linear layers (QKV 6144 x 4096, O 4096 x
 * 4096, gate/up 28672 x 4096, down 4096 x 14336) at M rows, in bf16 and in
 * every quantized format (int4 with groups of 128; GGUF blocks of one type
 * for all four), each GEMM timed alone (CUDA events, median) and summed.
 * Random codes (fp8 codes never NaN; GGUF bytes masked so every f16 scale
 * is finite). */
typedef struct qb_ctx {
    loom_cuda_gemm *g;
    int M;
    loom_cuda_qweight w;
    const void *wb; /* bf16 weight when w.fmt == NONE */
    void *x, *y, *scratch;
    size_t scratch_bytes;
} qb_ctx;

static void op_qgemm(void *p) {
    qb_ctx *c = p;
    char msg[256];
    int rc = c->w.fmt == LOOM_CUDA_Q_NONE
                 ? loom_cuda_gemm_run(c->g, LOOM_CUDA_BF16, 0, c->M, c->w.N, c->w.K, c->x, c->wb,
                                      c->y, 0, msg, sizeof msg)
                 : loom_cuda_qgemm_run(c->g, LOOM_CUDA_BF16, 0, c->M, &c->w, c->x, c->y,
                                       c->scratch, c->scratch_bytes, 0, msg, sizeof msg);
    if (rc) fprintf(stderr, "qgemm: %s\n", msg);
}

typedef struct qres {
    char fmt[64];
    int M;
    double ms, bf16_ms;
} qres;
#define MAX_QRES 256
static qres g_qres[MAX_QRES];
static int g_nqres;
/* the next free quant_linears entry, or NULL (said once) when full */
static qres *qres_next(void) {
    static int warned;
    if (g_nqres < MAX_QRES) return &g_qres[g_nqres++];
    if (!warned++) fprintf(stderr, "gpu_bench: more than %d quant_linears entries; the rest left out\n", MAX_QRES);
    return NULL;
}

static void *dev_bytes(size_t n, uint8_t mask) {
    uint8_t *h = malloc(n);
    uint64_t s = n * 0x9e3779b97f4a7c15ull + mask;
    for (size_t i = 0; i < n; i++) {
        s = s * 6364136223846793005ull + 1442695040888963407ull;
        h[i] = (uint8_t)(s >> 56) & mask;
    }
    void *d;
    CK(cudaMalloc(&d, n + 16));
    CK(cudaMemcpy(d, h, n, cudaMemcpyHostToDevice));
    free(h);
    return d;
}
static float *dev_floats(size_t n, float lo, float hi) {
    float *h = malloc(n * 4);
    for (size_t i = 0; i < n; i++) h[i] = lo + (hi - lo) * (float)((i * 2654435761u) % 1000) / 1000.0f;
    float *d;
    CK(cudaMalloc((void **)&d, n * 4 + 16));
    CK(cudaMemcpy(d, h, n * 4, cudaMemcpyHostToDevice));
    free(h);
    return d;
}

/* One Llama-3-8B layer's linears (N, K): QKV, O, gate|up, down. */
static const int l8b_linears[4][2] = {{6144, 4096}, {4096, 4096}, {28672, 4096}, {4096, 14336}};

/* A random N x K weight in bf16 (f == NONE: *data, no scales) or a loom
 * format (int8 / fp8 codes, int4 with groups of 128 and {scale, bias}
 * pairs; fp8 codes never NaN) on the device; *bytes grows by what a call
 * reads of it. The caller frees *data and *sc. */
static loom_cuda_qweight qb_weight(loom_cuda_qfmt f, int N, int K, void **data, float **sc, double *bytes) {
    enum { G = 128 };
    *sc = NULL;
    if (f == LOOM_CUDA_Q_NONE) {
        *data = dev_rand((size_t)N * K);
        *bytes += (double)N * K * 2;
        return (loom_cuda_qweight){.fmt = f, .N = N, .K = K};
    }
    const bool i4 = f == LOOM_CUDA_Q_INT4;
    *data = dev_bytes(i4 ? (size_t)N * K / 2 : (size_t)N * K, f == LOOM_CUDA_Q_FP8 ? 0x77 : 0xff);
    *sc = i4 ? dev_floats((size_t)N * (K / G) * 2, -0.01f, 0.01f) : dev_floats((size_t)N, 1e-3f, 2e-3f);
    *bytes += i4 ? (double)N * K / 2 + (double)N * (K / G) * 8 : (double)N * K + N * 4;
    return (loom_cuda_qweight){.fmt = f, .N = N, .K = K, .group = i4 ? G : 0, .data = *data, .scales = *sc};
}

/* The tiled layout's dequantize (the path above its kernel's bound: large
 * prefill chunks) alone on Llama-3-8B's gate|up weight, W8A16 and INT4
 * (g128): its bytes (codes and scales read, N K dt written) against the
 * copy bandwidth. */
typedef struct dq_ctx {
    loom_cuda_qweight w;
    void *out;
} dq_ctx;
static void op_tiled_dequant(void *p) {
    dq_ctx *c = p;
    CK(lc_qtiled_dequant(LOOM_CUDA_BF16, &c->w, c->out, 0));
}
static void bench_tiled_dequant(void) {
    const int N = 28672, K = 4096;
    const loom_cuda_qfmt fmts[2] = {LOOM_CUDA_Q_INT8_W8A16, LOOM_CUDA_Q_INT4};
    for (int fi = 0; fi < 2; fi++) {
        void *data = NULL;
        float *sc = NULL;
        double bytes = 0;
        dq_ctx c = {.w = qb_weight(fmts[fi], N, K, &data, &sc, &bytes)};
        /* what it reads once tiled: the codes and INT4's dt pairs (4 bytes a
         * row and group) or W8A16's f32 row scales */
        bytes = fi ? (double)N * K / 2 + (double)N * (K / 128) * 4 : (double)N * K + (double)N * 4;
        CK(loom_cuda_qweight_tile(&c.w, LOOM_CUDA_BF16, 0));
        CK(cudaMalloc(&c.out, (size_t)N * K * 2));
        const double ms = time_op(op_tiled_dequant, &c, 30);
        bytes += (double)N * K * 2;
        char nm[96];
        snprintf(nm, sizeof nm, "tiled dequantize %s %dx%d", fi ? "int4_g128" : "int8_w8a16", N, K);
        add_row(nm, ms, bytes, 0, 0);
        printf("    %-40s %8.1f us  %6.2f TB/s\n", nm, ms * 1e3, bytes / (ms * 1e-3) / 1e12);
        cudaFree(data), cudaFree(sc), cudaFree(c.out);
    }
}

static void bench_quant(int M) {
    const int(*shp)[2] = l8b_linears;
    enum { NF = 9 };
    static const loom_cuda_qfmt fmts[NF] = {LOOM_CUDA_Q_NONE, LOOM_CUDA_Q_INT8_W8A16,
                                            LOOM_CUDA_Q_INT8_W8A8, LOOM_CUDA_Q_FP8,
                                            LOOM_CUDA_Q_INT4, LOOM_CUDA_Q_GGUF, LOOM_CUDA_Q_GGUF,
                                            LOOM_CUDA_Q_GGUF, LOOM_CUDA_Q_GGUF};
    static const loom_cuda_gguf gtypes[NF] = {0, 0, 0, 0, 0, LOOM_CUDA_GGUF_Q4_0,
                                              LOOM_CUDA_GGUF_Q4_1, LOOM_CUDA_GGUF_Q4_K,
                                              LOOM_CUDA_GGUF_Q6_K};
    enum { QB_FP8 = 3 }; /* fmts[QB_FP8]: the FP8 row, run again above 8 rows with the other GEMM form */
    static const char *names[NF] = {"bf16", "int8_w8a16", "int8_w8a8", "fp8", "int4_g128",
                                    "gguf_q4_0", "gguf_q4_1", "gguf_q4_k", "gguf_q6_k"};
    int code;
    char msg[256];
    loom_cuda_gemm *g = loom_cuda_gemm_create((size_t)32 << 20, &code, msg, sizeof msg);
    if (!g) {
        printf("  quant bench: %s\n", msg);
        return;
    }
    void *x = dev_rand((size_t)M * 14336), *y;
    CK(cudaMalloc(&y, (size_t)M * 28672 * 2));
    double bf16_ms = 0;
    /* where the tensor-core GEMV runs (2 <= M <= 8) the four loom formats
     * once more on the CUDA-core one (loom_cuda_qgemm_set_tc_min_m(g, 9),
     * the cuda backend's qgemv_tc_min_rows: 9): its gain, in one
     * run */
    /* above 8 rows, FP8 once more with the GEMM form the dispatch does not
     * take at M: unit-scale cuBLASLt + the epilogue pass ("_epi",
     * lc_gemm_set_fp8_vec(0)) from LOOM_CUDA_FP8_VEC_MIN_M rows, cuBLASLt's
     * scale vectors ("_vec", the bound at 0) below */
    /* last, W8A16 and INT4 once more on weights repacked into the tiled
     * layout (loom_cuda_qweight_tile: qtiled.cu's kernel, or above its
     * bound the tiled dequantize + cuBLASLt) — old vs new in one run */
    /* (from 17 rows, where the tiled kernel runs its wgmma path, also with
     * that path's copies forced to cp.async, "_tiled_cpa", and to TMA,
     * "_tiled_tma" (the default picks by format and M), the wide TMA
     * kernel (256-row CTAs), "_tiled_wide", and with the path off: its
     * mma.sync one, "_tiled_mma"; above 64 rows also with the tiled bound
     * at 0: the tiled weight dequantized for cuBLASLt, "_tiled_deq", and
     * above the default bound with it raised: the kernel in chunks of 256
     * rows, "_tiled_chunks" (the forced kernels' rows in chunks there
     * too) — where the bounds belong) */
    const int nmma = M >= LC_QT_DEFAULT_WG_MIN_M ? 8 : 0; /* _tiled_cpa, _tiled_tma, _tiled_wide, _tiled_mma */
    const int nv0 = M >= 2 && M <= 8 ? NF + 4 : M > 8 ? NF + 1 : NF,
              nv = nv0 + 2 + nmma + (M > 64 ? 2 : 0) + (M > LC_QT_DEFAULT_MAX_M ? 2 : 0);
    const int vec0 = lc_gemm_fp8_vec(g);
    for (int vi = 0; vi < nv; vi++) {
        const bool tiled = vi >= nv0, cpa = tiled && vi >= nv0 + 2 && vi < nv0 + 4 && nmma,
                   tma = tiled && vi >= nv0 + 4 && vi < nv0 + 6 && nmma,
                   wide = tiled && vi >= nv0 + 6 && vi < nv0 + 8 && nmma,
                   mma = tiled && vi >= nv0 + 8 && vi < nv0 + 2 + nmma,
                   deq = vi >= nv0 + 2 + nmma && vi < nv0 + 4 + nmma, chunks = vi >= nv0 + 4 + nmma;
        lc_qtiled_set_wgmma_tma(cpa ? 0 : tma ? 1 : wide ? 4 : 2);
        /* above the default bound the forced kernels run in chunks too (else
         * each would be the dequantize again) */
        const bool raised = chunks || (M > LC_QT_DEFAULT_MAX_M && (cpa || tma || wide || mma));
        loom_cuda_qgemm_set_tiled_max_m(g, deq ? 0 : raised ? LC_QT_CHUNKED_MAX_M : LC_QT_DEFAULT_MAX_M);
        loom_cuda_qgemm_set_tiled_wgmma_min_m(g, mma ? 0 : LC_QT_DEFAULT_WG_MIN_M);
        const bool alt = !tiled && M > 8 && vi == NF, epi = alt && M >= LOOM_CUDA_FP8_VEC_MIN_M;
        const int fi = tiled ? ((vi - nv0) % 2 == 0 ? 1 : 4) : alt ? QB_FP8 : vi < NF ? vi : 1 + (vi - NF);
        const bool cores = !tiled && vi >= NF && !alt;
        loom_cuda_qgemm_set_tc_min_m(g, cores ? 9 : 0); /* 9: never; 0: the default bound */
        lc_gemm_set_fp8_vec(g, epi ? 0 : vec0);
        loom_cuda_qgemm_set_fp8_vec_min_m(g, alt && !epi ? 0 : LOOM_CUDA_FP8_VEC_MIN_M);
        const loom_cuda_qfmt f = fmts[fi];
        double ms = 0, bytes = 0, shape_us[4];
        long v0, e0;
        lc_qgemm_fp8_count(&v0, &e0);
        for (int k = 0; k < 4; k++) {
            const int N = shp[k][0], K = shp[k][1];
            qb_ctx c = {.g = g, .M = M, .x = x, .y = y};
            void *data = NULL;
            float *sc = NULL;
            if (f == LOOM_CUDA_Q_NONE) {
                c.w = qb_weight(f, N, K, &data, &sc, &bytes);
                c.wb = data;
            } else if (f == LOOM_CUDA_Q_GGUF) {
                /* bytes masked with 0xbb: f16 exponents <= 14, no inf / NaN */
                const size_t rb = loom_cuda_gguf_row_bytes(gtypes[fi], K);
                data = dev_bytes((size_t)N * rb + 16, 0xbb);
                c.w = (loom_cuda_qweight){.fmt = f, .N = N, .K = K, .data = data, .nseg = 1};
                c.w.seg[0] = (loom_cuda_qseg){.type = gtypes[fi], .rows = N, .data = data};
                c.scratch_bytes = loom_cuda_qgemm_scratch_bytes(g, LOOM_CUDA_BF16, 0, &c.w, M);
                if (c.scratch_bytes) CK(cudaMalloc(&c.scratch, c.scratch_bytes));
                bytes += (double)N * rb;
            } else {
                c.w = qb_weight(f, N, K, &data, &sc, &bytes);
                if (tiled) CK(loom_cuda_qweight_tile(&c.w, LOOM_CUDA_BF16, 0));
                c.scratch_bytes = loom_cuda_qgemm_scratch_bytes(g, LOOM_CUDA_BF16, 0, &c.w, M);
                if (c.scratch_bytes) CK(cudaMalloc(&c.scratch, c.scratch_bytes));
            }
            const double t = time_op(op_qgemm, &c, M >= 1024 ? 10 : 30);
            ms += t, shape_us[k] = t * 1e3;
            cudaFree(data), cudaFree(sc), cudaFree(c.scratch);
        }
        if (fi == 0) bf16_ms = ms;
        if (fi == QB_FP8 && M > 8) { /* which FP8 GEMM that row ran */
            long v, e;
            lc_qgemm_fp8_count(&v, &e);
            printf("    (fp8 GEMM calls of this row: %ld with cuBLASLt's scale vectors, %ld unit scales + epilogue)\n",
                   v - v0, e - e0);
        }
        char nm[96], label[32]; /* "_cc": the CUDA-core GEMV (qgemm.cu), not the tensor-core one */
        snprintf(label, sizeof label, "%s%s", names[fi],
                 cores ? "_cc"
                 : epi ? "_epi"
                 : alt ? "_vec"
                 : deq ? "_tiled_deq"
                 : chunks ? "_tiled_chunks"
                 : mma ? "_tiled_mma"
                 : cpa ? "_tiled_cpa"
                 : tma ? "_tiled_tma"
                 : wide ? "_tiled_wide"
                 : tiled ? "_tiled"
                         : "");
        snprintf(nm, sizeof nm, "llama3-8b layer linears %s M=%d", label, M);
        const double flops = 2.0 * M * (6144.0 * 4096 + 4096.0 * 4096 + 28672.0 * 4096 + 4096.0 * 14336);
        add_row(nm, ms, bytes + (double)M * (4096 * 3 + 14336) * 2, flops, 0);
        printf("    %-15s M=%-5d %8.1f us per layer, %5.2fx vs bf16   (QKV %.1f, O %.1f, gate|up %.1f, down %.1f us)\n",
               label, M, ms * 1e3, bf16_ms / ms, shape_us[0], shape_us[1], shape_us[2], shape_us[3]);
        qres *qr = qres_next();
        if (qr) {
            snprintf(qr->fmt, sizeof qr->fmt, "%s", label);
            qr->M = M, qr->ms = ms, qr->bf16_ms = bf16_ms;
        }
    }
    lc_gemm_set_fp8_vec(g, vec0);
    loom_cuda_qgemm_set_fp8_vec_min_m(g, LOOM_CUDA_FP8_VEC_MIN_M);
    loom_cuda_qgemm_set_tiled_max_m(g, LC_QT_DEFAULT_MAX_M);
    loom_cuda_qgemm_set_tiled_wgmma_min_m(g, LC_QT_DEFAULT_WG_MIN_M);
    cudaFree(x), cudaFree(y);
    loom_cuda_gemm_destroy(g);
}

/* One Llama-3-8B layer's four linear layers chained as a decode step runs
 * them: captured 8 layers deep into one CUDA graph on a stream (the GEMVs'
 * programmatic launches overlapping each other, no host launch cost) and
 * replayed; µs per layer, median of 15 replays. bf16 and each loom format
 * as dispatched. Timed
 * alone (bench_quant) a GEMV pays ~3-4 µs of launch. Chained GEMV after
 * GEMV, a kernel's start overlaps the one before (programmatic launch) —
 * which a decode step does not offer: there every GEMV follows a small
 * kernel. So `mixed` (M = 1) puts those small kernels between the linears
 * (add_rmsnorm before QKV, O and gate|up — the one before O standing in
 * for RoPE + attention — SwiGLU before down), each on the output of the
 * kernel before: µs a layer is then the linears plus the small kernels,
 * nearer what a step pays (a bulk-copy kernel, since deleted, won the plain
 * chain and not a decode step; docs/performance.md). W8A8 / FP8 rows pay
 * their activation quantization as a kernel of its own here, where the
 * engine fuses it into the norm and SwiGLU kernels; their TB/s (as every
 * mixed row's) divide the linears' bytes by a time that includes the small
 * kernels. */
static void bench_quant_chain(int M, bool mixed) {
    const int(*shp)[2] = l8b_linears;
    /* the last two: W8A16 / INT4 on tiled weights (qtiled.cu) */
    enum { NCF = 7 };
    static const loom_cuda_qfmt fmts[NCF] = {LOOM_CUDA_Q_NONE, LOOM_CUDA_Q_INT8_W8A16, LOOM_CUDA_Q_INT8_W8A8,
                                             LOOM_CUDA_Q_FP8,  LOOM_CUDA_Q_INT4,       LOOM_CUDA_Q_INT8_W8A16,
                                             LOOM_CUDA_Q_INT4};
    static const char *names[NCF] = {"bf16",      "int8_w8a16",       "int8_w8a8",      "fp8",
                                     "int4_g128", "int8_w8a16_tiled", "int4_g128_tiled"};
    enum { DEPTH = 8 };
    int code;
    char msg[256];
    loom_cuda_gemm *g = loom_cuda_gemm_create((size_t)32 << 20, &code, msg, sizeof msg);
    if (!g) {
        printf("  quant chain bench: %s\n", msg);
        return;
    }
    cudaStream_t st;
    CK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
    void *x = dev_rand((size_t)M * 28672), *y;
    CK(cudaMalloc(&y, (size_t)M * 28672 * 2));
    /* mixed: a decode layer's small kernels between the linears, on the
     * data they pass on — add_rmsnorm before QKV, O (after a stand-in for
     * attention: another add_rmsnorm over the QKV output) and gate|up,
     * SwiGLU before down — so every GEMV follows a small kernel as in a
     * step; buffers: residual (f32), norm weights, normed token, outputs */
    float *resid = NULL, *nw = NULL;
    void *xn = NULL, *o[4] = {NULL, NULL, NULL, NULL}, *act = NULL;
    if (mixed) {
        resid = dev_floats((size_t)M * 4096, -1.0f, 1.0f);
        nw = dev_floats(4096, 0.5f, 1.5f);
        xn = dev_rand((size_t)M * 4096);
        act = dev_rand((size_t)M * 14336);
        for (int k = 0; k < 4; k++) o[k] = dev_rand((size_t)M * shp[k][0]);
    }
    double bf16_us = 0;
    const char *kind = mixed ? "mixed  " : "chained";
    for (int fi = 0; fi < NCF; fi++) {
        const loom_cuda_qfmt f = fmts[fi];
        void *data[4] = {0};
        float *sc[4] = {0};
        loom_cuda_qweight w[4];
        size_t scr = 0;
        double bytes = 0;
        for (int k = 0; k < 4; k++) {
            w[k] = qb_weight(f, shp[k][0], shp[k][1], &data[k], &sc[k], &bytes);
            if (f == LOOM_CUDA_Q_NONE) continue;
            if (fi >= 5) CK(loom_cuda_qweight_tile(&w[k], LOOM_CUDA_BF16, 0));
            const size_t b = loom_cuda_qgemm_scratch_bytes(g, LOOM_CUDA_BF16, 0, &w[k], M);
            if (b > scr) scr = b;
        }
        void *scratch = NULL;
        if (scr) CK(cudaMalloc(&scratch, scr));
        /* one eager pass (plans, attributes), then the capture; a failed
         * call is reported and the row skipped */
        int rc = 0;
        cudaGraph_t gr = NULL;
        for (int pass = 0; pass < 2 && !rc; pass++) {
            if (pass == 1) CK(cudaStreamBeginCapture(st, cudaStreamCaptureModeThreadLocal));
            for (int l = 0; l < (pass ? DEPTH : 1) && !rc; l++)
                for (int k = 0; k < 4 && !rc; k++) {
                    const void *in = x;
                    void *out = y;
                    if (mixed) { /* the small kernel before linear k, on the previous linear's output */
                        cudaError_t e;
                        if (k < 3)
                            e = loom_cuda_add_rmsnorm(LOOM_CUDA_BF16, xn, resid, o[k == 0 ? 3 : k - 1], nw, NULL,
                                                      M, 4096, 1e-5f, st);
                        else
                            e = loom_cuda_swiglu(LOOM_CUDA_BF16, act, o[2], M, 14336, st);
                        if (e != cudaSuccess) {
                            snprintf(msg, sizeof msg, "small kernel: %s", cudaGetErrorString(e));
                            rc = 1;
                            break;
                        }
                        in = k < 3 ? xn : act, out = o[k];
                    }
                    rc = f == LOOM_CUDA_Q_NONE
                             ? loom_cuda_gemm_run(g, LOOM_CUDA_BF16, 0, M, w[k].N, w[k].K, in, data[k], out, st, msg,
                                                  sizeof msg)
                             : loom_cuda_qgemm_run(g, LOOM_CUDA_BF16, 0, M, &w[k], in, out, scratch, scr, st, msg,
                                                   sizeof msg);
                }
            if (pass == 0) CK(cudaStreamSynchronize(st));
            else if (cudaStreamEndCapture(st, &gr) != cudaSuccess && !rc) rc = -1;
        }
        if (rc) {
            printf("    %s %s M=%-3d ERROR: %s\n", kind, names[fi], M, rc == -1 ? "capture failed" : msg);
            (void)cudaGetLastError();
            if (gr) cudaGraphDestroy(gr);
            for (int k = 0; k < 4; k++) cudaFree(data[k]), cudaFree(sc[k]);
            cudaFree(scratch);
            continue;
        }
        const double us = graph_ms(gr, st) * 1e3 / DEPTH;
        if (fi == 0) bf16_us = us;
        const double ref_us = bf16_us;
        char label[32], nm[96];
        snprintf(label, sizeof label, "%s", names[fi]);
        snprintf(nm, sizeof nm, "llama3-8b layer linears %s %s M=%d", mixed ? "mixed" : "chained", label, M);
        const double flops = 2.0 * M * (6144.0 * 4096 + 4096.0 * 4096 + 28672.0 * 4096 + 4096.0 * 14336);
        add_row(nm, us * 1e-3, bytes + (double)M * (4096 * 3 + 14336) * 2, flops, 0);
        printf("    %s %-16s M=%-3d %8.1f us per layer, %5.2fx vs bf16, %5.2f TB/s\n", kind, label, M, us,
               ref_us / us, bytes / (us * 1e-6) / 1e12);
        qres *qr = qres_next();
        if (qr) {
            snprintf(qr->fmt, sizeof qr->fmt, "%s_%s", mixed ? "mixed" : "chain", label);
            qr->M = M, qr->ms = us * 1e-3, qr->bf16_ms = ref_us * 1e-3;
        }
        cudaGraphDestroy(gr);
        for (int k = 0; k < 4; k++) cudaFree(data[k]), cudaFree(sc[k]);
        cudaFree(scratch);
    }
    cudaFree(x), cudaFree(y);
    cudaFree(resid), cudaFree(nw), cudaFree(xn), cudaFree(act);
    for (int k = 0; k < 4; k++) cudaFree(o[k]);
    cudaStreamDestroy(st);
    loom_cuda_gemm_destroy(g);
}

/* ------------------------------------------------ one decode layer, whole */

/* One Llama-3-8B decode layer as a step records it (cuda_forward.c's
 * cb_record_layers at one token: add_rmsnorm + QKV, RoPE + KV write,
 * attention over ctx keys, O, add_rmsnorm + gate|up, SwiGLU + down, through
 * the same entry points, so W8A8 / FP8 quantize inside their norms),
 * DEPTH layers in one CUDA graph, µs a layer. bf16 also runs with each
 * small kernel left out in turn, bf16 and W8A16 with each linear left out:
 * the difference is what that kernel costs inside a graph, between the
 * kernels it separates (with one left out the next kernel reads stale
 * data; only the time counts). 32 of these plus the LM head against the
 * engine's TPOT is what the step spends outside its layers. */
enum { DL_NORM = 1, DL_ROPE = 2, DL_ATTN = 4, DL_SWIGLU = 8, DL_QKV = 16, DL_O = 32, DL_GU = 64, DL_DOWN = 128 };
enum { DL_FUSE_ROPE = 1, DL_FUSE_SWIGLU = 2 }; /* dl_layer's fuse mask */
#define DL_LINEARS (DL_QKV | DL_O | DL_GU | DL_DOWN)
typedef struct dl_ctx {
    loom_cuda_gemm *g;
    float *xres, *nw, *cs;
    void *r, *xn, *qkv, *att, *gu, *act, *kc, *vc, *scratch;
    size_t scr;
    int32_t *pos;
    int64_t *slot;
    loom_cuda_attn_args aa;
} dl_ctx;

/* One layer as a step records it. fuse, a mask of DL_FUSE_*:
 * as a one-token step does with those kinds fused — RoPE + KV write and / or
 * SwiGLU in the QKV and gate|up GEMVs (pair epilogues, loom_cuda_epi), the
 * down projection then reading act; the others as before them (separate
 * rope_kv; SwiGLU in its own kernel, or in W8A8 / FP8's activation
 * quantization), with the small kernels in skip left out (bf16). */
static int dl_layer(dl_ctx *c, const loom_cuda_qweight *w, void *const *wb, int skip, int fuse, cudaStream_t st,
                    char *msg, size_t n) {
    const int H = 4096, I = 14336, NH = 32, KVH = 8, D = 128, QKV = (NH + 2 * KVH) * D, QD = NH * D;
    const bool quant = w[0].fmt != LOOM_CUDA_Q_NONE;
    void *gout[2] = {c->qkv, c->gu};
    const int gn[2] = {QKV, 2 * I};
    const loom_cuda_epi epi[2] = {{.kind = LOOM_CUDA_EPI_ROPE_KV, .kv = LOOM_CUDA_KV_DT, .cs = c->cs,
                                   .pos = c->pos, .slot = c->slot, .k_cache = c->kc, .v_cache = c->vc,
                                   .num_heads = NH, .num_kv_heads = KVH, .head_dim = D, .block_size = 16},
                                  {.kind = LOOM_CUDA_EPI_SWIGLU, .act = c->act}};
    for (int half = 0; half < 2; half++) {
        int rc;
        const loom_cuda_epi *e = fuse & (half ? DL_FUSE_SWIGLU : DL_FUSE_ROPE) ? &epi[half] : NULL;
        if (skip & (half ? DL_GU : DL_QKV)) { /* the norm only (bf16 / W8A16 / INT4: no activation codes) */
            CK(loom_cuda_add_rmsnorm(LOOM_CUDA_BF16, c->xn, c->xres, c->r, c->nw, NULL, 1, H, 1e-5f, st));
            rc = 0;
        } else if (quant) {
            rc = loom_cuda_qgemm_norm_epi_run(c->g, LOOM_CUDA_BF16, 1, &w[2 * half], c->xres, c->r, c->nw, 1e-5f,
                                              c->xn, gout[half], e, c->scratch, c->scr, st, msg, n);
        } else {
            if (!(skip & DL_NORM)) CK(loom_cuda_add_rmsnorm(LOOM_CUDA_BF16, c->xn, c->xres, c->r, c->nw, NULL, 1, H,
                                                            1e-5f, st));
            rc = loom_cuda_gemm_epi_run(c->g, LOOM_CUDA_BF16, 1, gn[half], H, c->xn, wb[2 * half], gout[half], e,
                                        st, msg, n);
        }
        if (rc) return rc;
        if (half == 0) {
            if (!(fuse & DL_FUSE_ROPE) && !(skip & DL_ROPE))
                CK(loom_cuda_rope_kv(LOOM_CUDA_BF16, LOOM_CUDA_KV_DT, c->qkv, QKV, NULL, c->cs, c->pos, c->slot,
                                     c->kc, c->vc, 1, NH, KVH, D, 16, st));
            if (!(skip & DL_ATTN)) CK(loom_cuda_attention(&c->aa, st));
            rc = skip & DL_O ? 0
                 : quant ? loom_cuda_qgemm_run(c->g, LOOM_CUDA_BF16, 0, 1, &w[1], c->att, c->r, c->scratch, c->scr,
                                             st, msg, n)
                       : loom_cuda_gemm_run(c->g, LOOM_CUDA_BF16, 0, 1, H, QD, c->att, wb[1], c->r, st, msg, n);
            if (rc) return rc;
        }
    }
    if (skip & DL_DOWN) { /* the SwiGLU stays where it is not fused */
        if (!(fuse & DL_FUSE_SWIGLU)) CK(loom_cuda_swiglu(LOOM_CUDA_BF16, c->act, c->gu, 1, I, st));
        return 0;
    }
    if (fuse & DL_FUSE_SWIGLU)
        return quant ? loom_cuda_qgemm_run(c->g, LOOM_CUDA_BF16, 0, 1, &w[3], c->act, c->r, c->scratch, c->scr, st,
                                           msg, n)
                     : loom_cuda_gemm_run(c->g, LOOM_CUDA_BF16, 0, 1, H, I, c->act, wb[3], c->r, st, msg, n);
    if (quant)
        return loom_cuda_qgemm_swiglu_run(c->g, LOOM_CUDA_BF16, 1, &w[3], c->gu, c->act, c->r, c->scratch, c->scr,
                                          st, msg, n);
    if (skip & DL_SWIGLU)
        return loom_cuda_gemm_run(c->g, LOOM_CUDA_BF16, 0, 1, H, I, c->act, wb[3], c->r, st, msg, n);
    return loom_cuda_gemm_swiglu_run(c->g, LOOM_CUDA_BF16, 1, H, I, c->gu, wb[3], c->act, c->r, st, msg, n);
}

static void bench_decode_layer(int ctx) {
    const int H = 4096, I = 14336, NH = 32, KVH = 8, D = 128, bs = 16, QKV = (NH + 2 * KVH) * D, QD = NH * D;
    enum { DEPTH = 8 };
    int code;
    char msg[256];
    dl_ctx c = {0};
    c.g = loom_cuda_gemm_create((size_t)32 << 20, &code, msg, sizeof msg);
    if (!c.g) {
        printf("  decode layer bench: %s\n", msg);
        return;
    }
    cudaStream_t st;
    CK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
    c.xres = dev_floats(H, -1.0f, 1.0f), c.nw = dev_floats(H, 0.5f, 1.5f);
    c.r = dev_rand(H), c.xn = dev_rand(H), c.qkv = dev_rand(QKV), c.att = dev_rand(QD);
    c.gu = dev_rand(2 * I), c.act = dev_rand(I);
    const int nblk = (ctx + bs - 1) / bs + 1;
    c.kc = dev_rand((size_t)nblk * KVH * bs * D), c.vc = dev_rand((size_t)nblk * KVH * bs * D);
    c.cs = dev_floats((size_t)(ctx + 1) * D, -1.0f, 1.0f);
    int32_t p = ctx - 1, *btab = malloc((size_t)nblk * 4);
    int64_t sl = ctx - 1;
    for (int i = 0; i < nblk; i++) btab[i] = i;
    void *d_bt, *d_stride, *d_tiles;
    const loom_cuda_attn_tile tile = {0, 0, 1, 0};
    CK(cudaMalloc((void **)&c.pos, 4));
    CK(cudaMemcpy(c.pos, &p, 4, cudaMemcpyHostToDevice));
    CK(cudaMalloc((void **)&c.slot, 8));
    CK(cudaMemcpy(c.slot, &sl, 8, cudaMemcpyHostToDevice));
    CK(cudaMalloc(&d_bt, (size_t)nblk * 4));
    CK(cudaMemcpy(d_bt, btab, (size_t)nblk * 4, cudaMemcpyHostToDevice));
    CK(cudaMalloc(&d_stride, 4));
    CK(cudaMemcpy(d_stride, &nblk, 4, cudaMemcpyHostToDevice));
    CK(cudaMalloc(&d_tiles, sizeof tile));
    CK(cudaMemcpy(d_tiles, &tile, sizeof tile, cudaMemcpyHostToDevice));
    int sms = 132;
    cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0);
    const int msplit = loom_cuda_attn_max_splits(
        1, KVH, sms * loom_cuda_attn_ctas_per_sm(LOOM_CUDA_BF16, LOOM_CUDA_KV_DT, LOOM_CUDA_ATTN_DECODE, D));
    float *ws;
    int *sem;
    CK(cudaMalloc((void **)&ws, loom_cuda_attn_workspace_floats(LOOM_CUDA_ATTN_DECODE, 1, KVH, D, msplit) * 4 + 16));
    CK(cudaMalloc((void **)&sem, KVH * sizeof(int)));
    CK(cudaMemset(sem, 0, KVH * sizeof(int)));
    c.aa = (loom_cuda_attn_args){.dt = LOOM_CUDA_BF16, .shape = LOOM_CUDA_ATTN_DECODE, .out = c.att, .ldo = QD,
                                 .q = c.qkv, .ldq = QKV, .k_cache = c.kc, .v_cache = c.vc, .block_table = d_bt,
                                 .bt_stride = d_stride, .positions = c.pos, .tiles = d_tiles, .num_tiles = 1,
                                 .num_heads = NH, .num_kv_heads = KVH, .head_dim = D, .block_size = bs,
                                 .scale = 0.088388f, .max_splits = msplit, .partial = ws, .sem = sem};
    /* unfused: a layer without the pair epilogues, bf16's ablations
     * against that; then fused (what a step runs). A variant with linears
     * or small kernels left out follows the one it is measured against. */
    /* tiled: the weights repacked (qtiled.cu: RoPE + KV write in QKV's
     * K-split reduce, as a step does with backend.qtiled_epilogues) */
    static const struct { loom_cuda_qfmt fmt; int skip, fuse; const char *name; bool tiled; } vars[] = {
        {LOOM_CUDA_Q_NONE, 0, 0, "bf16 unfused"},
        {LOOM_CUDA_Q_NONE, DL_ROPE, 0, "bf16 without rope_kv"},
        {LOOM_CUDA_Q_NONE, DL_ATTN, 0, "bf16 without attention"},
        {LOOM_CUDA_Q_NONE, DL_NORM, 0, "bf16 without the 2 add_rmsnorm"},
        {LOOM_CUDA_Q_NONE, DL_SWIGLU, 0, "bf16 without swiglu"},
        {LOOM_CUDA_Q_NONE, 0, 3, "bf16 both fused"},
        {LOOM_CUDA_Q_NONE, DL_QKV, 3, "bf16 without QKV"},
        {LOOM_CUDA_Q_NONE, DL_O, 3, "bf16 without O"},
        {LOOM_CUDA_Q_NONE, DL_GU, 3, "bf16 without gate|up"},
        {LOOM_CUDA_Q_NONE, DL_DOWN, 3, "bf16 without down"},
        {LOOM_CUDA_Q_NONE, DL_LINEARS, 3, "bf16 without the linears"},
        {LOOM_CUDA_Q_INT8_W8A16, 0, 1, "int8_w8a16 rope fused"},
        {LOOM_CUDA_Q_INT8_W8A16, DL_QKV, 1, "int8_w8a16 without QKV"},
        {LOOM_CUDA_Q_INT8_W8A16, DL_O, 1, "int8_w8a16 without O"},
        {LOOM_CUDA_Q_INT8_W8A16, DL_GU, 1, "int8_w8a16 without gate|up"},
        {LOOM_CUDA_Q_INT8_W8A16, DL_DOWN, 1, "int8_w8a16 without down"},
        {LOOM_CUDA_Q_INT8_W8A16, DL_LINEARS, 1, "int8_w8a16 without the linears"},
        {LOOM_CUDA_Q_INT8_W8A16, 0, 3, "int8_w8a16 both fused"},
        {LOOM_CUDA_Q_INT8_W8A16, DL_QKV, 3, "int8_w8a16 both fused without QKV"},
        {LOOM_CUDA_Q_INT8_W8A16, DL_O, 3, "int8_w8a16 both fused without O"},
        {LOOM_CUDA_Q_INT8_W8A16, DL_GU, 3, "int8_w8a16 both fused without gate|up"},
        {LOOM_CUDA_Q_INT8_W8A16, DL_DOWN, 3, "int8_w8a16 both fused without down"},
        {LOOM_CUDA_Q_INT8_W8A8, 0, 3, "int8_w8a8 both fused"},
        {LOOM_CUDA_Q_FP8, 0, 3, "fp8 both fused"},
        {LOOM_CUDA_Q_INT4, 0, 1, "int4_g128 rope fused"},
        {LOOM_CUDA_Q_INT4, 0, 3, "int4_g128 both fused"},
        {LOOM_CUDA_Q_INT8_W8A16, 0, 1, "int8_w8a16 rope fused (again)"},
        {LOOM_CUDA_Q_INT8_W8A16, 0, 3, "int8_w8a16 both fused (again)"},
        {LOOM_CUDA_Q_INT4, 0, 3, "int4_g128 tiled", 1},
        {LOOM_CUDA_Q_INT8_W8A16, 0, 3, "int8_w8a16 tiled", 1},
        {LOOM_CUDA_Q_NONE, 0, 3, "bf16 both fused (again)"},
    };
    printf("  one Llama-3-8B decode layer, whole (ctx %d, %d deep in a CUDA graph):\n", ctx, DEPTH);
    double full_us = 0, base_us = 0; /* bf16 unfused; the variant the next left-out ones compare with */
    for (size_t vi = 0; vi < sizeof vars / sizeof vars[0]; vi++) {
        const loom_cuda_qfmt f = vars[vi].fmt;
        void *data[4] = {0};
        float *sc[4] = {0};
        loom_cuda_qweight w[4];
        double bytes = 0;
        c.scr = 0;
        for (int k = 0; k < 4; k++) {
            w[k] = qb_weight(f, l8b_linears[k][0], l8b_linears[k][1], &data[k], &sc[k], &bytes);
            if (f == LOOM_CUDA_Q_NONE) continue;
            if (vars[vi].tiled) CK(loom_cuda_qweight_tile(&w[k], LOOM_CUDA_BF16, 0));
            const size_t b = loom_cuda_qgemm_scratch_bytes(c.g, LOOM_CUDA_BF16, 0, &w[k], 1);
            if (b > c.scr) c.scr = b;
        }
        c.scratch = NULL;
        if (c.scr) CK(cudaMalloc(&c.scratch, c.scr));
        int rc = 0;
        cudaGraph_t gr = NULL;
        const long fused0 = loom_cuda_epi_fused_count();
        for (int pass = 0; pass < 2 && !rc; pass++) { /* one eager layer (plans), then the capture */
            if (pass == 1) CK(cudaStreamBeginCapture(st, cudaStreamCaptureModeThreadLocal));
            for (int l = 0; l < (pass ? DEPTH : 1) && !rc; l++)
                rc = dl_layer(&c, w, data, vars[vi].skip, vars[vi].fuse, st, msg, sizeof msg);
            if (pass == 0) CK(cudaStreamSynchronize(st));
            else if (cudaStreamEndCapture(st, &gr) != cudaSuccess && !rc) rc = -1;
        }
        if (!rc) {
            const double us = graph_ms(gr, st) * 1e3 / DEPTH;
            if (vi == 0) full_us = us;
            if (!vars[vi].skip) base_us = us;
            char nm[96];
            snprintf(nm, sizeof nm, "llama3-8b decode layer ctx %d %s", ctx, vars[vi].name);
            add_row(nm, us * 1e-3, bytes, 0, 0);
            const long fused = loom_cuda_epi_fused_count() - fused0; /* per kind fused: 1 + DEPTH */
            if (vars[vi].skip)
                printf("    %-40s %8.1f us a layer (%+.1f us: what it left out costs)\n", vars[vi].name, us,
                       base_us - us);
            else
                printf("    %-40s %8.1f us a layer, %5.2fx bf16's unfused layer, %ld fused epilogues\n",
                       vars[vi].name, us, full_us / us, fused);
            qres *qr = qres_next();
            if (qr) {
                snprintf(qr->fmt, sizeof qr->fmt, "layer_%s", vars[vi].name);
                for (char *s = qr->fmt; *s; s++)
                    if (*s == ' ' || *s == ',') *s = '_';
                qr->M = 1, qr->ms = us * 1e-3, qr->bf16_ms = full_us * 1e-3;
            }
        } else {
            printf("    %-34s ERROR: %s\n", vars[vi].name, rc == -1 ? "capture failed" : msg);
            (void)cudaGetLastError();
        }
        if (gr) cudaGraphDestroy(gr);
        for (int k = 0; k < 4; k++) cudaFree(data[k]), cudaFree(sc[k]);
        cudaFree(c.scratch);
    }
    cudaFree(c.xres), cudaFree(c.nw), cudaFree(c.cs), cudaFree(c.r), cudaFree(c.xn), cudaFree(c.qkv);
    cudaFree(c.att), cudaFree(c.gu), cudaFree(c.act), cudaFree(c.kc), cudaFree(c.vc), cudaFree(c.pos);
    cudaFree(c.slot), cudaFree(d_bt), cudaFree(d_stride), cudaFree(d_tiles), cudaFree(ws), cudaFree(sem);
    free(btab);
    cudaStreamDestroy(st);
    loom_cuda_gemm_destroy(c.g);
}

/* Every kernel of one Llama-3-8B layer at T tokens (T = 1: decode at
 * context `ctx`; T > 1: one prefill of T tokens), plus the LM head, timed
 * alone: what a step would cost with no gaps between kernels. With tp > 1
 * the shapes one tensor-parallel rank runs (heads, KV heads, FFN width and
 * vocabulary divided by tp; the collectives between them are not timed
 * here: bench/gpu/tp_comm_bench does that). */
static void bench_components_tp(int T, int ctx, int gemv_max_m, int tp) {
    const int H = 4096, I = 14336 / tp, NH = 32 / tp, KVH = 8 / tp, D = 128, V = (128256 + tp - 1) / tp,
              L = 32, bs = 16;
    const int QKV = (NH + 2 * KVH) * D, QD = NH * D;
    comp_ctx c = {.T = T, .H = H, .I = I, .NH = NH, .KVH = KVH, .D = D};
    int code;
    char msg[256];
    c.g = loom_cuda_gemm_create((size_t)32 << 20, &code, msg, sizeof msg);
    loom_cuda_gemm_set_gemv_max_m(c.g, gemv_max_m);
    void *wbig = dev_rand((size_t)V * H), *xin = dev_rand((size_t)T * I * 2 + 16);
    void *ybuf;
    CK(cudaMalloc(&ybuf, (size_t)(T > 256 ? T : 256) * V * 4));
    if (tp > 1) printf("  one rank of tensor-parallel size %d (%d heads, %d KV heads, FFN %d, vocab %d):\n", tp, NH,
                       KVH, I, V);
    printf("  per-kernel times, Llama-3-8B layer at T=%d%s%s%s:\n", T, T == 1 ? " (decode)" : " (prefill)",
           T <= 8 ? (gemv_max_m >= T ? ", GEMV kernel" : ", cuBLASLt") : "",
           T > 8 || gemv_max_m < T ? ", heuristic pick" : "");
    struct { const char *n; int N, K, f32, per_layer; } gm[5] = {
        {"gemm qkv", QKV, H, 0, 1}, {"gemm o", H, QD, 0, 1}, {"gemm gate_up", 2 * I, H, 0, 1},
        {"gemm down", H, I, 0, 1}, {"gemm lm_head (1 row)", V, H, 1, 0}};
    double layer_ms = 0, total_extra = 0;
    for (int i = 0; i < 5; i++) {
        c.M = gm[i].per_layer ? T : 1, c.N = gm[i].N, c.K = gm[i].K, c.out_f32 = gm[i].f32;
        c.x = xin, c.w = wbig, c.y = ybuf;
        double ms = time_op(op_gemm, &c, 20);
        double bytes = 2.0 * c.N * c.K, fl = 2.0 * c.M * c.N * (double)c.K;
        printf("    %-26s %8.1f us  %6.0f GB/s  %6.0f TFLOP/s\n", gm[i].n, ms * 1e3,
               bytes / (ms * 1e-3) / 1e9, fl / (ms * 1e-3) / 1e12);
        if (gm[i].per_layer) layer_ms += ms;
        else total_extra += ms;
    }
    c.xf = dev_rand((size_t)T * H * 2); /* read as floats: finite, small */
    c.r = dev_rand((size_t)T * H);
    CK(cudaMalloc(&c.yn, (size_t)T * H * 2));
    c.wn = dev_rand((size_t)H * 2);
    double ms = time_op(op_norm, &c, 20);
    printf("    %-26s %8.1f us  (x2 per layer)\n", "add_rmsnorm", ms * 1e3);
    layer_ms += 2 * ms;
    c.gu = dev_rand((size_t)T * 2 * I);
    CK(cudaMalloc(&c.act, (size_t)T * I * 2));
    ms = time_op(op_swiglu, &c, 20);
    printf("    %-26s %8.1f us\n", "swiglu", ms * 1e3);
    layer_ms += ms;
    /* rope + KV write, then attention over a context of ctx (decode) or T */
    const int kv_len = T == 1 ? ctx : T, nblk = (kv_len + bs - 1) / bs + 1;
    c.qkv = dev_rand((size_t)T * QKV);
    c.kc = dev_rand((size_t)nblk * KVH * bs * D);
    c.vc = dev_rand((size_t)nblk * KVH * bs * D);
    int32_t *pos = malloc((size_t)T * 4), *btab = malloc((size_t)nblk * 4);
    int64_t *slot = malloc((size_t)T * 8);
    for (int t = 0; t < T; t++) pos[t] = kv_len - T + t, slot[t] = pos[t];
    for (int i = 0; i < nblk; i++) btab[i] = i;
    CK(cudaMalloc((void **)&c.pos, (size_t)T * 4));
    CK(cudaMemcpy(c.pos, pos, (size_t)T * 4, cudaMemcpyHostToDevice));
    CK(cudaMalloc((void **)&c.slot, (size_t)T * 8));
    CK(cudaMemcpy(c.slot, slot, (size_t)T * 8, cudaMemcpyHostToDevice));
    CK(cudaMalloc((void **)&c.cs, (size_t)(kv_len + 1) * D / 2 * 2 * 4));
    CK(cudaMemset(c.cs, 0, (size_t)(kv_len + 1) * D / 2 * 2 * 4));
    ms = time_op(op_rope, &c, 20);
    printf("    %-26s %8.1f us\n", "rope_kv", ms * 1e3);
    layer_ms += ms;
    void *d_bt, *d_stride, *d_tiles, *out;
    int stride = nblk;
    CK(cudaMalloc(&d_bt, (size_t)nblk * 4));
    CK(cudaMemcpy(d_bt, btab, (size_t)nblk * 4, cudaMemcpyHostToDevice));
    CK(cudaMalloc(&d_stride, 4));
    CK(cudaMemcpy(d_stride, &stride, 4, cudaMemcpyHostToDevice));
    const int G = NH / KVH, tpt = T == 1 ? 1 : 64 / G, ntiles = (T + tpt - 1) / tpt;
    loom_cuda_attn_tile *tl = malloc(sizeof *tl * (size_t)ntiles);
    for (int i = 0; i < ntiles; i++)
        tl[i] = (loom_cuda_attn_tile){0, i * tpt, T - i * tpt < tpt ? T - i * tpt : tpt, 0};
    CK(cudaMalloc(&d_tiles, sizeof *tl * (size_t)ntiles));
    CK(cudaMemcpy(d_tiles, tl, sizeof *tl * (size_t)ntiles, cudaMemcpyHostToDevice));
    CK(cudaMalloc(&out, (size_t)T * QD * 2));
    int sms = 132;
    cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0);
    loom_cuda_attn_shape shp = T == 1 ? LOOM_CUDA_ATTN_DECODE : LOOM_CUDA_ATTN_PREFILL;
    int msplit = loom_cuda_attn_max_splits(ntiles, KVH,
                                           sms * loom_cuda_attn_ctas_per_sm(LOOM_CUDA_BF16, LOOM_CUDA_KV_DT, shp, D));
    float *ws;
    int *sem;
    CK(cudaMalloc((void **)&ws, loom_cuda_attn_workspace_floats(shp, ntiles, KVH, D, msplit) * 4 + 16));
    CK(cudaMalloc((void **)&sem, (size_t)ntiles * KVH * sizeof(int)));
    CK(cudaMemset(sem, 0, (size_t)ntiles * KVH * sizeof(int)));
    c.aa = (loom_cuda_attn_args){.dt = LOOM_CUDA_BF16, .shape = shp, .out = out, .ldo = QD,
                                 .q = c.qkv, .ldq = QKV, .k_cache = c.kc, .v_cache = c.vc,
                                 .block_table = d_bt, .bt_stride = d_stride, .positions = c.pos,
                                 .tiles = d_tiles, .num_tiles = ntiles, .num_heads = NH,
                                 .num_kv_heads = KVH, .head_dim = D, .block_size = bs,
                                 .scale = 0.088388f, .max_splits = msplit, .partial = ws,
                                 .sem = sem};
    ms = time_op(op_attn, &c, 20);
    double afl = 4.0 * NH * D * (T == 1 ? (double)kv_len : (double)T * (T + 1) / 2);
    printf("    %-26s %8.1f us  %6.0f TFLOP/s  (kv_len %d, %d tiles, splits <= %d)\n", "attention",
           ms * 1e3, afl / (ms * 1e-3) / 1e12, kv_len, ntiles, msplit);
    layer_ms += ms;
    printf("    per layer %.1f us; x %d layers + LM head = %.3f ms of kernels back to back\n",
           layer_ms * 1e3, L, layer_ms * L + total_extra);
    loom_cuda_gemm_destroy(c.g);
    cudaFree(wbig), cudaFree(xin), cudaFree(ybuf), cudaFree(c.xf), cudaFree(c.r), cudaFree(c.yn);
    cudaFree(c.wn), cudaFree(c.gu), cudaFree(c.act), cudaFree(c.qkv), cudaFree(c.kc), cudaFree(c.vc);
    cudaFree(c.pos), cudaFree(c.slot), cudaFree(c.cs), cudaFree(d_bt), cudaFree(d_stride);
    cudaFree(d_tiles), cudaFree(out), cudaFree(ws), cudaFree(sem);
    free(pos), free(btab), free(slot), free(tl);
}

static void bench_components(int T, int ctx, int gemv_max_m) { bench_components_tp(T, ctx, gemv_max_m, 1); }

/* ------------------------------------------------------- backend workloads */

typedef struct backend {
    void *lib;
    const loom_component *comp;
    const loom_backend_ops *ops;
} backend;

/* One step: nseq sequences, each with `nnew` tokens after `done` in its
 * own contiguous blocks (seq s owns blocks [s * per_seq, ...)). Logits of
 * each sequence's last token. */
typedef struct stepbuf {
    loom_batch b;
    int32_t *tok, *pos, *qs, *ctx, *bt, *lidx;
    int64_t *slot;
} stepbuf;

static void step_build(stepbuf *sb, int nseq, int done, int nnew, int per_seq, int bs, int vocab) {
    int T = nseq * nnew;
    sb->tok = realloc(sb->tok, (size_t)T * 4);
    sb->pos = realloc(sb->pos, (size_t)T * 4);
    sb->slot = realloc(sb->slot, (size_t)T * 8);
    sb->lidx = realloc(sb->lidx, (size_t)nseq * 4);
    sb->qs = realloc(sb->qs, (size_t)(nseq + 1) * 4);
    sb->ctx = realloc(sb->ctx, (size_t)nseq * 4);
    sb->bt = realloc(sb->bt, (size_t)nseq * per_seq * 4);
    int t = 0;
    sb->qs[0] = 0;
    for (int s = 0; s < nseq; s++) {
        for (int j = 0; j < per_seq; j++) sb->bt[s * per_seq + j] = s * per_seq + j;
        for (int j = 0; j < nnew; j++, t++) {
            int p = done + j;
            sb->tok[t] = (int32_t)((p * 7919u + s * 104729u) % (unsigned)vocab);
            sb->pos[t] = p;
            sb->slot[t] = (int64_t)(s * per_seq + p / bs) * bs + p % bs;
        }
        sb->lidx[s] = t - 1;
        sb->qs[s + 1] = t;
        sb->ctx[s] = done + nnew;
    }
    sb->b = (loom_batch){.struct_size = sizeof(loom_batch), .num_seqs = nseq, .num_tokens = T,
                         .token_ids = sb->tok, .positions = sb->pos, .query_start = sb->qs,
                         .context_len = sb->ctx, .block_table = sb->bt,
                         .block_table_stride = per_seq, .slot_mapping = sb->slot,
                         .num_logits = nseq, .logits_index = sb->lidx};
}

/* Elements of a layer's FFN weights that `experts` routed experts' worth
 * of a token reads (a dense model: its FFN; a mixture of experts: the
 * router, that many experts and the shared expert). */
static double ffn_elems(const loom_model_config *c, double experts) {
    const double H = c->hidden_size;
    if (c->num_experts <= 0) return 3.0 * c->intermediate_size * H;
    return c->num_experts * H + experts * 3.0 * c->expert_intermediate_size * H +
           3.0 * c->shared_expert_intermediate_size * H;
}

/* Bytes a decode step must read: every linear weight and the LM head once
 * (of a mixture of experts, the experts nseq tokens choose: at most
 * nseq x experts per token — the active weights at batch 1), the embedding
 * rows, and the K/V of the context. */
/* Bytes a linear weight takes (2: bf16; quantized runs set it for their
 * format: run_model_q). */
static double g_wbytes = 2.0;

static double decode_bytes(const loom_model_config *c, int nseq, int ctx) {
    const double H = c->hidden_size, V = c->vocab_size;
    const double QD = (double)c->num_heads * c->head_dim, KVD = (double)c->num_kv_heads * c->head_dim;
    double used = (double)nseq * c->num_experts_used;
    if (used > c->num_experts) used = c->num_experts;
    const double lin = H * (QD + 2 * KVD) + QD * H + ffn_elems(c, used);
    return g_wbytes * lin * c->num_layers + 2.0 * V * H + 2.0 * 2.0 * KVD * c->num_layers * (double)ctx * nseq;
}
static double step_flops(const loom_model_config *c, double tokens, double attn_pairs) {
    const double H = c->hidden_size, V = c->vocab_size;
    const double QD = (double)c->num_heads * c->head_dim, KVD = (double)c->num_kv_heads * c->head_dim;
    const double lin = H * (QD + 2 * KVD) + QD * H + ffn_elems(c, c->num_experts_used);
    return 2.0 * lin * c->num_layers * tokens + 2.0 * V * H * 1 +
           4.0 * attn_pairs * c->num_heads * c->head_dim * c->num_layers;
}

/* layers > 0: the shape cut to that many layers (named so in the rows);
 * batches: the decode batch sizes run on one load; qb: a quantizer the
 * backend loads with (NULL: bf16), qlabel its rows' tag and wbytes the bytes
 * of one quantized linear weight. */
static bool run_model_q(const backend *be, const char *shape, int layers, const int *batches, int nbatch,
                        int decode_ctx, int prefill_tokens, int iters, const loom_quant_binding *qb,
                        const char *qlabel, double wbytes) {
    loom_model_load_opts o = {.format = "dummy", .dummy_shape = shape, .seed = 1,
                              .dummy_dtype = LOOM_DTYPE_BF16, .num_layers_override = layers};
    char label[64];
    if (layers > 0) snprintf(label, sizeof label, "%s (%d layers)%s%s", shape, layers, qlabel ? " " : "",
                             qlabel ? qlabel : "");
    else snprintf(label, sizeof label, "%s%s%s", shape, qlabel ? " " : "", qlabel ? qlabel : "");
    g_wbytes = qb ? wbytes : 2.0;
    loom_model *m = NULL;
    loom_error e = {0};
    loom_status st = loom_model_load(&o, &m, &e);
    if (st) {
        printf("  %s: model load failed: %s\n", shape, e.message);
        return false;
    }
    const loom_model_view *view = loom_model_view_get(m);
    const loom_model_config *c = view->config;
    const int bs = 16;
    int max_seq_tokens = decode_ctx + iters + 16 > prefill_tokens ? decode_ctx + iters + 16
                                                                  : prefill_tokens;
    const int per_seq = (max_seq_tokens + bs - 1) / bs;
    int nseq_max = 1;
    for (int i = 0; i < nbatch; i++) nseq_max = batches[i] > nseq_max ? batches[i] : nseq_max;
    /* no prefill to time (--moe-batch1, run_model's decode-only rows): no piecewise
     * graphs, whose captures at kv_alloc — a warm forward for each of ~130
     * token buckets — would fill a profiler's launch window before the first
     * decode step; decode steps replay their own graphs either way */
    const char *ov[] = {"cuda_graphs=true", "max_batched_tokens=4096",
                        prefill_tokens > 0 ? NULL : "piecewise_graphs=false", NULL};
    void *cfg = gpu_config_make(be->comp, ov), *inst = NULL;
    loom_kv_layout kvl = {.struct_size = sizeof kvl, .block_size = bs,
                          .num_blocks = per_seq * nseq_max, .dtype = LOOM_DTYPE_COUNT};
    float *logits = malloc((size_t)nseq_max * c->vocab_size * 4);
    stepbuf sb = {0};
    bool ok = false;
    char name[96];
    double t0 = now_s();
    if ((st = be->ops->create(loom_host_default(), cfg, &inst, &e)) ||
        (st = be->ops->load(inst, view, qb, &e)) || (st = be->ops->kv_alloc(inst, &kvl, &e))) {
        printf("  %s: backend setup failed: %s\n", shape, e.message);
        goto out;
    }
    printf("  %s: loaded in %.1f s\n", shape, now_s() - t0);
    /* decode: prefill the contexts (in chunks), then time single-token steps */
    for (int bi = 0; bi < nbatch; bi++) {
        const int b = batches[bi];
        if (b <= 0) continue;
        for (int done = 0; done < decode_ctx;) {
            int n = decode_ctx - done < 2048 / b ? decode_ctx - done : 2048 / b;
            step_build(&sb, b, done, n, per_seq, bs, c->vocab_size);
            if ((st = be->ops->forward(inst, &sb.b, logits, &e))) goto fail;
            done += n;
        }
        double *t = malloc(sizeof(double) * (size_t)iters);
        for (int i = -10; i < iters; i++) { /* 10 warm-up steps include the graph capture */
            step_build(&sb, b, decode_ctx + 10 + i, 1, per_seq, bs, c->vocab_size);
            double a = now_s();
            if ((st = be->ops->forward(inst, &sb.b, logits, &e))) {
                free(t);
                goto fail;
            }
            if (i >= 0) t[i] = now_s() - a;
        }
        double ms = median(t, iters) * 1e3;
        free(t);
        snprintf(name, sizeof name, "%s decode batch %d ctx %d", label, b, decode_ctx);
        add_row(name, ms, decode_bytes(c, b, decode_ctx + 30),
                step_flops(c, b, (double)b * (decode_ctx + 30)), b / (ms * 1e-3));
    }
    if (prefill_tokens > 0) {
        double t[7];
        for (int i = -2; i < 7; i++) {
            step_build(&sb, 1, 0, prefill_tokens, per_seq, bs, c->vocab_size);
            double a = now_s();
            if ((st = be->ops->forward(inst, &sb.b, logits, &e))) goto fail;
            if (i >= 0) t[i] = now_s() - a;
        }
        double ms = median(t, 7) * 1e3;
        snprintf(name, sizeof name, "%s prefill %d tokens", label, prefill_tokens);
        const double P = prefill_tokens;
        add_row(name, ms, decode_bytes(c, 1, 0),
                step_flops(c, P, P * (P + 1) / 2), P / (ms * 1e-3));
    }
    ok = true;
    goto out;
fail:
    printf("  %s: forward failed: %s\n", shape, e.message);
out:
    if (inst) be->ops->destroy(inst);
    free(cfg), free(logits);
    free(sb.tok), free(sb.pos), free(sb.slot), free(sb.lidx), free(sb.qs), free(sb.ctx), free(sb.bt);
    loom_model_free(m);
    return ok;
}

static bool run_model(const backend *be, const char *shape, int layers, int decode_batch, int decode_ctx,
                      int prefill_tokens, int iters) {
    return run_model_q(be, shape, layers, &decode_batch, 1, decode_ctx, prefill_tokens, iters, NULL, NULL, 2.0);
}

/* --moe-quant: the Mixtral-8x7B shape cut to `layers` layers with every
 * linear weight but the embedding / LM head quantized by each quantizer of
 * DIR in turn (int8 W8A16, int8 W8A8, fp8, int4 groups of 128), after the
 * bf16 run: batch-1 decode (per-pair GEMVs over the chosen experts) and a
 * 2048-token prefill (the grouped GEMM). */
static int run_moe_quant(const backend *be, const char *dir, int layers) {
    static const struct {
        const char *name, *label, *ov;
        double wbytes;
    } qs[4] = {{"int8", "int8-w8a16", "mode=w8a16", 1.0},
               {"int8", "int8-w8a8", "mode=w8a8", 1.0},
               {"fp8", "fp8", "scales=per_channel", 1.0},
               {"int4", "int4-g128", "group_size=128", 0.5 + 8.0 / 128}};
    int failed = !run_model(be, "mixtral-8x7b", layers, 1, 512, 2048, 100);
    for (int i = 0; i < 4; i++) {
        char path[1024];
        void *lib = NULL;
        snprintf(path, sizeof path, "%s/%s/loom-quantizer-%s.so", dir, qs[i].name, qs[i].name);
        const loom_component *comp = gpu_plugin_find(&lib, path, LOOM_KIND_QUANTIZER, qs[i].name);
        if (!comp) {
            printf("  cannot load quantizer %s from %s\n", qs[i].name, path);
            failed++;
            continue;
        }
        const loom_quant_ops *ops = comp->ops;
        const char *ov[] = {qs[i].ov, NULL};
        void *cfg = gpu_config_make(comp, ov), *self = NULL;
        loom_error e = {0};
        if (ops->create(loom_host_default(), cfg, &self, &e)) {
            printf("  quantizer %s: %s\n", qs[i].label, e.message);
            failed++;
        } else {
            const loom_quant_binding qb = {.struct_size = sizeof qb, .ops = ops, .self = self, .name = qs[i].label};
            static const int one = 1;
            failed += !run_model_q(be, "mixtral-8x7b", layers, &one, 1, 512, 2048, 100, &qb, qs[i].label, qs[i].wbytes);
            ops->destroy(self);
        }
        free(cfg);
    }
    return failed;
}

/* -------------------------------------------------------------------- main */

int main(int argc, char **argv) {
    if (argc < 2 || !strcmp(argv[1], "--help") || !strcmp(argv[1], "-h")) {
        fprintf(argc < 2 ? stderr : stdout,
                "usage: gpu_bench OUT.json [loom-backend-cuda.so] [--quick] [--components] [--quant] [--quant-m M]\n"
                "                [--layer CTX]\n"
                "  kernel and engine timings on the GPU, written to OUT.json (docs/performance.md reads them)\n"
                "  --quick         fewer repetitions, no batch-64 engine run\n"
                "  --components    every kernel of one Llama-3-8B layer timed alone, several batch sizes\n"
                "  --quant         the quantized linear layers only (M = 1, 2, 8, 16, 64, 128, 256, 2048; M = 1 also chained)\n"
                "  --quant-m M     those at M only; M <= 8 also chained in a CUDA graph (M = 1: also with a\n"
                "                  layer's small kernels between the linears, 'mixed'; M > 256: also the tiled\n"
                "                  layout's dequantize alone, against the copy bandwidth)\n"
                "  --attention     the decode attention rows only (bf16 and E4M3 caches)\n"
                "  --layer CTX     one whole decode layer (norms, linears, RoPE, attention over CTX keys, SwiGLU)\n"
                "                  in a CUDA graph, every format; bf16 also with each small kernel left out\n"
                "  --moe LAYERS    a mixture-of-experts dummy shape (bf16) cut to LAYERS layers only, loaded once:\n"
                "                  batch-1 and batch-8 decode at 512 tokens of context (bytes: the weights the\n"
                "                  tokens' experts read) and a 2048-token prefill\n"
                "  --moe-shape S   that shape: mixtral-8x7b (default) or qwen3-30b-a3b\n"
                "  --moe-batch1    with --moe: batch-1 decode only (a profiler's window then holds only its steps)\n"
                "  --moe-quant LAYERS  the Mixtral-8x7B shape in bf16, then quantized by each quantizer (int8 w8a16,\n"
                "                  int8 w8a8, fp8, int4 g128; from --quantizer-dir DIR, default plugins/quantizer):\n"
                "                  batch-1 decode and a 2048-token prefill each\n");
        return argc < 2 ? 2 : 0;
    }
    const char *out_path = argv[1];
    const char *so = LOOM_CUDA_BACKEND_DEFAULT;
    bool quick = false, components_only = false, quant_only = false, attention_only = false, moe_batch1 = false;
    int quant_m = 0, layer_ctx = 0, moe_layers = 0, moe_quant_layers = 0;
    const char *quant_dir = "plugins/quantizer";
    const char *moe_shape = "mixtral-8x7b";
    int failed = 0;
    for (int i = 2; i < argc; i++) {
        if (!strcmp(argv[i], "--quick")) quick = true;
        else if (!strcmp(argv[i], "--components")) components_only = true;
        else if (!strcmp(argv[i], "--quant")) quant_only = true;
        else if (!strcmp(argv[i], "--attention")) attention_only = true;
        else if (!strcmp(argv[i], "--quant-m") && i + 1 < argc) quant_m = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--layer") && i + 1 < argc) layer_ctx = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--moe") && i + 1 < argc) moe_layers = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--moe-quant") && i + 1 < argc) moe_quant_layers = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--quantizer-dir") && i + 1 < argc) quant_dir = argv[++i];
        else if (!strcmp(argv[i], "--moe-shape") && i + 1 < argc) moe_shape = argv[++i];
        else if (!strcmp(argv[i], "--moe-batch1")) moe_batch1 = true;
        else so = argv[i];
    }
    if (moe_batch1 && moe_layers <= 0) {
        fprintf(stderr, "gpu_bench: --moe-batch1 needs --moe LAYERS\n");
        return 2;
    }
    struct cudaDeviceProp prop;
    CK(cudaGetDeviceProperties(&prop, 0));
    time_t now = time(NULL);
    char date[64];
    strftime(date, sizeof date, "%Y-%m-%dT%H:%M:%SZ", gmtime(&now));
    printf("gpu_bench: %s (%d SMs), %s, commit %s\n", prop.name, prop.multiProcessorCount, date,
           getenv("LOOM_COMMIT") ? getenv("LOOM_COMMIT") : "?");

    measure_copy();
    measure_gemm();
    if (layer_ctx > 0) { /* --layer CTX: that only */
        bench_decode_layer(layer_ctx);
        goto write;
    }
    if (attention_only) goto attention;
    if (moe_layers > 0 || moe_quant_layers > 0) goto engine;
    printf("  quantized linear layers (one Llama-3-8B layer: QKV, O, gate/up, down):\n");
    if (quant_m > 0) { /* --quant-m M: that M only */
        bench_quant(quant_m);
        if (quant_m > LC_QT_DEFAULT_MAX_M) bench_tiled_dequant();
        if (quant_m <= 8) bench_quant_chain(quant_m, false);
        if (quant_m == 1) bench_quant_chain(1, true);
        goto write;
    }
    bench_quant(1);
    bench_quant_chain(1, false);
    bench_quant_chain(1, true);
    bench_quant(2);
    bench_quant(8);
    bench_quant(16);
    bench_quant(64);
    bench_quant(128);
    bench_quant(256);
    bench_quant(2048);
    bench_tiled_dequant();
    if (quant_only) goto write;
    bench_components(1, 512, 8);
    bench_components(1, 512, 0);
    if (components_only) {
        bench_components_tp(1, 512, 8, 2); /* what each of 2 tensor-parallel ranks runs */
        bench_components(8, 0, 8);
        bench_components(64, 0, 8);
        bench_components(256, 0, 8);
    }
    bench_components(2048, 0, 8);
    if (components_only) return 0;
attention:
    { /* per shape: a bf16 KV cache, then E4M3 (half the bytes) */
        static const int shapes[][2] = {{1, 32768}, {8, 32768}, {512, 256}, /* a 128/128 decode step */
                                        {256, 1024}, {512, 1024}, {64, 4096},
                                        {256, 3072}}; /* a 2048/2048 decode step, halfway */
        const int nsh = quick ? 3 : (int)(sizeof shapes / sizeof shapes[0]);
        for (int i = 0; i < nsh; i++) {
            bench_attention(shapes[i][0], shapes[i][1], LOOM_CUDA_KV_DT);
            bench_attention(shapes[i][0], shapes[i][1], LOOM_CUDA_KV_E4M3);
        }
    }
    if (attention_only) goto write;

engine:;
    backend be = {0};
    be.comp = gpu_plugin_find(&be.lib, so, LOOM_KIND_BACKEND, "cuda");
    if (!be.comp) {
        printf("  cannot load the cuda backend from %s\n", so);
        failed = 1;
    } else {
        be.ops = be.comp->ops;
        if (moe_quant_layers > 0) { /* --moe-quant LAYERS: that only */
            failed += run_moe_quant(&be, quant_dir, moe_quant_layers);
            goto write;
        }
        if (moe_layers > 0) { /* --moe LAYERS: that only */
            static const int moe_batches[2] = {1, 8};
            failed += !run_model_q(&be, moe_shape, moe_layers, moe_batches, moe_batch1 ? 1 : 2, 512,
                                   moe_batch1 ? 0 : 2048, 100, NULL, NULL, 2.0);
            goto write;
        }
        failed += !run_model(&be, "smollm2-135m", 0, 1, 512, 0, quick ? 50 : 200);
        failed += !run_model(&be, "llama3-8b", 0, 1, 512, 2048, quick ? 30 : 100);
        if (!quick) failed += !run_model(&be, "llama3-8b", 0, 64, 512, 0, 30);
    }

write:;
    FILE *f = fopen(out_path, "w");
    if (!f) {
        fprintf(stderr, "cannot write %s\n", out_path);
        return 1;
    }
    fprintf(f, "{\n  \"device\": \"%s\",\n  \"sms\": %d,\n  \"date\": \"%s\",\n  \"commit\": \"%s\",\n",
            prop.name, prop.multiProcessorCount, date, getenv("LOOM_COMMIT") ? getenv("LOOM_COMMIT") : "?");
    fprintf(f, "  \"copy_bytes_per_s\": %.6g,\n  \"gemm_bf16_flops_per_s\": %.6g,\n  \"rows\": [\n",
            g_copy_bw, g_gemm_flops);
    for (int i = 0; i < g_nrows; i++) {
        const row *r = &g_rows[i];
        fprintf(f, "    {\"name\": \"%s\", \"ms\": %.6g, \"bytes\": %.6g, \"flops\": %.6g, "
                "\"tokens_per_s\": %.6g, \"roofline_ratio\": %.4f, \"bound\": \"%s\"}%s\n",
                r->name, r->ms, r->bytes, r->flops, r->per_s, r->ratio, r->bound,
                i + 1 < g_nrows ? "," : "");
    }
    fprintf(f, "  ],\n  \"quant_linears\": [\n");
    for (int i = 0; i < g_nqres; i++)
        fprintf(f, "    {\"format\": \"%s\", \"M\": %d, \"layer_ms\": %.6g, \"bf16_layer_ms\": "
                "%.6g, \"speedup_vs_bf16\": %.4f}%s\n", g_qres[i].fmt, g_qres[i].M, g_qres[i].ms,
                g_qres[i].bf16_ms, g_qres[i].bf16_ms / g_qres[i].ms, i + 1 < g_nqres ? "," : "");
    fprintf(f, "  ]\n}\n");
    fclose(f);

    printf("\n%-46s %10s %10s %12s %10s %8s\n", "workload", "ms", "GB", "TFLOP", "tok/s", "roof%");
    for (int i = 0; i < g_nrows; i++) {
        const row *r = &g_rows[i];
        printf("%-46s %10.3f %10.3f %12.3f %10.1f %7.1f%% (%s)\n", r->name, r->ms, r->bytes / 1e9,
               r->flops / 1e12, r->per_s, 100 * r->ratio, r->bound);
    }
    printf("wrote %s\n", out_path);
    return failed ? 1 : 0;
}
