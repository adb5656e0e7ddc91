/*
 * kernels/cuda/gemm.c — the linear layers: y (M, N) = x (M, K) @ w^T with
 * bf16/f16 operands and float32 accumulation, through cuBLASLt.
 *
 * Row-major y = x w^T is column-major y^T = w x^T: cuBLASLt sees A = w as a
 * (K, N) column-major matrix used transposed, B = x as (K, M) column-major,
 * D = y^T as (N, M) with ld N — the "TN" GEMM every cuBLAS kernel family
 * serves best. Descriptors and the heuristic's algorithm are cached per
 * (M, N, K, dt, output type) in a small table (round-robin replacement), so
 * a decode step or a replayed CUDA graph pays for no heuristic query. The
 * workspace is allocated once; no call allocates, so every call may be
 * captured into a CUDA graph. Small batches (M <= gemv_max_m, default 8)
 * go to the streaming GEMV of gemv.cu instead, which reads the weights
 * closer to copy bandwidth than cuBLASLt's picks at those shapes.
 *
 * Batch-invariant mode (loom_cuda_gemm_set_batch_invariant): every M runs
 * the GEMV (in passes of 8 rows), whose per-row arithmetic does not depend
 * on M, and the quantized formats their GEMV likewise, so a row of y has
 * the same bits whatever other rows share the call. cuBLASLt is never used
 * then: its kernel choice (tile shape, split-K) follows M.
 */
#include <limits.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <cublasLt.h>
#include <cublas_api.h> /* CUBLAS_VER_MAJOR / _MINOR */
#include <cuda_runtime_api.h>

#include "cuda_kernels.h"
#include "gemv.h"
#include "qgemm.h"

#define LC_GEMM_CACHE 96

typedef struct lc_gemm_plan {
    bool valid;
    bool unsupported; /* the heuristic had no algorithm: remembered, not re-asked */
    int m, n, k, dt, out_f32;
    int kind;       /* 0: dt operands; else an LC_LT_* quantized GEMM (qgemm.h) */
    bool int_scale; /* alpha / beta are int32 (int8 GEMM), else float       */
    cublasLtMatmulDesc_t op;
    cublasLtMatrixLayout_t la, lb, lc;
    cublasLtMatmulAlgo_t algo;
} lc_gemm_plan;

struct loom_cuda_gemm {
    cublasLtHandle_t lt;
    void *ws;
    size_t ws_bytes;
    lc_gemm_plan plans[LC_GEMM_CACHE];
    int next;       /* round-robin victim                          */
    int gemv_max_m; /* M at or below which gemv.cu runs (0 = never) */
    int q_gemv_max_m[6]; /* per loom_cuda_qfmt: largest M of the quantized GEMV */
    int invariant;  /* batch-invariant: the GEMVs at every M, no cuBLASLt */
    int q_tiled_max_m; /* tiled W8A16 / INT4: largest M of qtiled.cu's kernel */
    int q_tiled_wg_min_m; /* tiled: fewest M of its wgmma path (0: never) */
    int fp8_vec;    /* FP8 GEMMs may take per-row / per-column scale vectors */
    int fp8_vec_min_m; /* ... from this many rows (fewer: unit scales + epilogue) */
    int q_tc_min_m; /* rows from which the quantized GEMV takes the tensor cores (0: per format) */
    long long plans_made;  /* plan-cache misses: descriptors + heuristic query */
    double plan_seconds;   /* host time they took                              */
};

static const float lc_one_f = 1.0f, lc_zero_f = 0.0f;
static const int32_t lc_one_i = 1, lc_zero_i = 0;

#define LC_GEMM_CANDIDATES 8

static void lc_plan_free(lc_gemm_plan *p) {
    if (!p->valid) return;
    if (p->op) cublasLtMatmulDescDestroy(p->op);
    if (p->la) cublasLtMatrixLayoutDestroy(p->la);
    if (p->lb) cublasLtMatrixLayoutDestroy(p->lb);
    if (p->lc) cublasLtMatrixLayoutDestroy(p->lc);
    memset(p, 0, sizeof *p);
}

static void lc_msg(char *msg, size_t n, const char *fmt, const char *what, int code) {
    if (msg && n) snprintf(msg, n, fmt, what, code);
}

loom_cuda_gemm *loom_cuda_gemm_create(size_t workspace_bytes, int *code, char *msg,
                                      size_t msg_size) {
    loom_cuda_gemm *g = calloc(1, sizeof *g);
    if (!g) {
        if (code) *code = CUBLAS_STATUS_ALLOC_FAILED;
        lc_msg(msg, msg_size, "%s (%d)", "out of host memory for the GEMM context", 0);
        return NULL;
    }
    cublasStatus_t st = cublasLtCreate(&g->lt);
    if (st != CUBLAS_STATUS_SUCCESS) {
        if (code) *code = (int)st;
        lc_msg(msg, msg_size, "%s failed with cuBLAS status %d", "cublasLtCreate", (int)st);
        free(g);
        return NULL;
    }
    if (workspace_bytes) {
        cudaError_t e = cudaMalloc(&g->ws, workspace_bytes);
        if (e != cudaSuccess) {
            if (code) *code = 10000 + (int)e;
            lc_msg(msg, msg_size, "%s failed with CUDA error %d", "cudaMalloc(GEMM workspace)",
                   (int)e);
            cublasLtDestroy(g->lt);
            free(g);
            return NULL;
        }
        g->ws_bytes = workspace_bytes;
    }
    g->gemv_max_m = LC_GEMV_MAX_M;
    /* quantized GEMV bounds: passes of 8 rows re-read the (small) weights;
     * the GEMM path pays a dt copy (W8A16 / INT4) or runs on tensor cores
     * (FP8 / W8A8). Starting points, to be tuned with gpu_bench. */
    g->q_tiled_max_m = LC_QT_DEFAULT_MAX_M;
    g->q_tiled_wg_min_m = LC_QT_DEFAULT_WG_MIN_M;
    g->q_gemv_max_m[LOOM_CUDA_Q_INT8_W8A16] = 16;
    g->q_gemv_max_m[LOOM_CUDA_Q_INT8_W8A8] = 8;
    g->q_gemv_max_m[LOOM_CUDA_Q_FP8] = 8;
    g->q_gemv_max_m[LOOM_CUDA_Q_INT4] = 32;
    g->q_gemv_max_m[LOOM_CUDA_Q_GGUF] = 32; /* as INT4 (similar bytes per weight); not yet measured */
    /* cuBLASLt's outer-vector scaling (LC_LT_FP8_VEC_*) for the FP8 GEMMs
     * from 129 rows: one Llama-3-8B layer at 2048 rows 1.51x bf16 against
     * 1.13x with the unit-scale GEMM + epilogue pass (H200), which wins at
     * 16-128 rows (cuda_kernels.h); a shape it has no algorithm for falls
     * back by itself (qgemm.c) */
    g->fp8_vec = 1;
    g->fp8_vec_min_m = LOOM_CUDA_FP8_VEC_MIN_M;
    if (code) *code = 0;
    return g;
}

void loom_cuda_gemm_destroy(loom_cuda_gemm *g) {
    if (!g) return;
    for (int i = 0; i < LC_GEMM_CACHE; i++) lc_plan_free(&g->plans[i]);
    if (g->ws) cudaFree(g->ws);
    cublasLtDestroy(g->lt);
    free(g);
}

/* cuBLAS 12.9 brought the outer-vector scale mode; older headers lack it
 * and FP8 then always takes unit scales + the epilogue pass (qgemm.c) */
#if CUBLAS_VER_MAJOR > 12 || (CUBLAS_VER_MAJOR == 12 && CUBLAS_VER_MINOR >= 9)
#define LC_HAVE_OUTER_VEC 1
#else
#define LC_HAVE_OUTER_VEC 0
#endif

static int lc_lt_vec(int kind) {
    return kind == LC_LT_FP8_VEC_BF16 || kind == LC_LT_FP8_VEC_F16 || kind == LC_LT_FP8_VEC_F32;
}

/* The scale vectors of an outer-vector FP8 plan: descriptor attributes, so
 * set for each call (host-side only: graph capture records the matmul with
 * the pointers it was given). */
static cublasStatus_t lc_set_scales(lc_gemm_plan *p, const float *sa, const float *sb) {
    cublasStatus_t st = cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, &sa, sizeof sa);
    if (st == CUBLAS_STATUS_SUCCESS)
        st = cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, &sb, sizeof sb);
    return st;
}

/* Build descriptors and pick an algorithm for one shape: the heuristic's
 * first choice. (Timing its first LC_GEMM_CANDIDATES on the caller's
 * operands and keeping the fastest gained nothing measurable on an H200 for
 * Llama-3-8B's shapes, and was deleted; the query still asks for that many,
 * so the first pick is the one it always was.) */
static int lc_plan_make(loom_cuda_gemm *g, lc_gemm_plan *p, int kind, loom_cuda_dt dt,
                        int out_f32, int M, int N, int K, const float *sa, const float *sb, char *msg,
                        size_t msg_size) {
    cudaDataType_t ab = dt == LOOM_CUDA_F16 ? CUDA_R_16F : CUDA_R_16BF;
    cudaDataType_t cd = out_f32 ? CUDA_R_32F : ab;
    cublasComputeType_t ct = CUBLAS_COMPUTE_32F;
    cudaDataType_t scale_t = CUDA_R_32F;
    /* quantized operands (qgemm.c): A = w, B = x in the same "TN" layout;
     * FP8 needs TN and 16-byte aligned leading dimensions on sm_90, int8
     * IMMA needs TN and K % 4 == 0 — a shape that does not fit gets no
     * algorithm from the heuristic and the caller falls back */
    switch (kind) {
    case LC_LT_FP8_BF16:
    case LC_LT_FP8_VEC_BF16: ab = CUDA_R_8F_E4M3, cd = CUDA_R_16BF; break;
    case LC_LT_FP8_F16:
    case LC_LT_FP8_VEC_F16: ab = CUDA_R_8F_E4M3, cd = CUDA_R_16F; break;
    case LC_LT_FP8_F32:
    case LC_LT_FP8_VEC_F32: ab = CUDA_R_8F_E4M3, cd = CUDA_R_32F; break;
    case LC_LT_I8_I32:
        ab = CUDA_R_8I, cd = CUDA_R_32I, ct = CUBLAS_COMPUTE_32I, scale_t = CUDA_R_32I;
        break;
    default: break;
    }
    cublasStatus_t st;
    const char *what = "cublasLtMatmulDescCreate";
    memset(p, 0, sizeof *p);
    p->valid = true; /* so lc_plan_free releases what was made on failure */
    p->int_scale = scale_t == CUDA_R_32I;
    if ((st = cublasLtMatmulDescCreate(&p->op, ct, scale_t))) goto fail;
    cublasOperation_t ta = CUBLAS_OP_T, tb = CUBLAS_OP_N;
    what = "cublasLtMatmulDescSetAttribute";
    if ((st = cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof ta)) ||
        (st = cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof tb)))
        goto fail;
    if (lc_lt_vec(kind)) {
#if LC_HAVE_OUTER_VEC
        /* A = w: one scale per row of op(A), i.e. per output channel n;
         * B = x: one per column of B, i.e. per token m. A library older
         * than these headers refuses the attributes: "not supported" then,
         * so the caller falls back instead of failing */
        const int32_t vec = CUBLASLT_MATMUL_MATRIX_SCALE_OUTER_VEC_32F;
        what = "cublasLtMatmulDescSetAttribute (FP8 outer-vector scale mode)";
        if (cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_A_SCALE_MODE, &vec, sizeof vec) ||
            cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_B_SCALE_MODE, &vec, sizeof vec) ||
            lc_set_scales(p, sa, sb)) {
            st = CUBLAS_STATUS_NOT_SUPPORTED;
            goto fail;
        }
#else
        (void)sa, (void)sb;
        st = CUBLAS_STATUS_NOT_SUPPORTED;
        what = "FP8 outer-vector scales (cuBLAS < 12.9)";
        goto fail;
#endif
    }
    what = "cublasLtMatrixLayoutCreate";
    if ((st = cublasLtMatrixLayoutCreate(&p->la, ab, (uint64_t)K, (uint64_t)N, (int64_t)K)) ||
        (st = cublasLtMatrixLayoutCreate(&p->lb, ab, (uint64_t)K, (uint64_t)M, (int64_t)K)) ||
        (st = cublasLtMatrixLayoutCreate(&p->lc, cd, (uint64_t)N, (uint64_t)M, (int64_t)N)))
        goto fail;

    cublasLtMatmulPreference_t pref = NULL;
    what = "cublasLtMatmulPreferenceCreate";
    if ((st = cublasLtMatmulPreferenceCreate(&pref))) goto fail;
    size_t ws = g->ws_bytes;
    st = cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws,
                                              sizeof ws);
    cublasLtMatmulHeuristicResult_t res[LC_GEMM_CANDIDATES];
    int found = 0;
    memset(res, 0, sizeof res);
    if (st == CUBLAS_STATUS_SUCCESS)
        st = cublasLtMatmulAlgoGetHeuristic(g->lt, p->op, p->la, p->lb, p->lc, p->lc, pref,
                                            LC_GEMM_CANDIDATES, res, &found);
    cublasLtMatmulPreferenceDestroy(pref);
    what = "cublasLtMatmulAlgoGetHeuristic";
    if (st) goto fail;
    if (found < 1) {
        st = CUBLAS_STATUS_NOT_SUPPORTED;
        what = "cublasLtMatmulAlgoGetHeuristic (no algorithm for this shape)";
        goto fail;
    }
    p->algo = res[0].algo;
    p->m = M, p->n = N, p->k = K, p->dt = (int)dt, p->out_f32 = out_f32, p->kind = kind;
    return 0;

fail:
    if (msg && msg_size)
        snprintf(msg, msg_size, "%s failed with cuBLAS status %d for GEMM M=%d N=%d K=%d", what,
                 (int)st, M, N, K);
    lc_plan_free(p);
    return (int)st ? (int)st : 1;
}

static double lc_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

void loom_cuda_gemm_plan_stats(const loom_cuda_gemm *g, long long *made, double *seconds) {
    *made = g ? g->plans_made : 0;
    *seconds = g ? g->plan_seconds : 0.0;
}

/* cuBLASLt for one shape and operand kind (0: dt; else LC_LT_*), through
 * the plan cache. */
static int lc_lt_run(loom_cuda_gemm *g, int kind, loom_cuda_dt dt, int out_f32, int M, int N,
                     int K, const void *x, const void *w, void *y, const float *sa,
                     const float *sb, cudaStream_t s, char *msg, size_t msg_size) {
    if (kind) dt = LOOM_CUDA_BF16, out_f32 = 0; /* the kind alone names the types */
    lc_gemm_plan *p = NULL;
    for (int i = 0; i < LC_GEMM_CACHE; i++) {
        lc_gemm_plan *c = &g->plans[i];
        if (c->valid && c->m == M && c->n == N && c->k == K && c->dt == (int)dt &&
            c->out_f32 == out_f32 && c->kind == kind) {
            p = c;
            break;
        }
    }
    if (!p) {
        p = &g->plans[g->next];
        g->next = (g->next + 1) % LC_GEMM_CACHE;
        lc_plan_free(p);
        const double t0 = lc_now();
        int rc = lc_plan_make(g, p, kind, dt, out_f32, M, N, K, sa, sb, msg, msg_size);
        g->plans_made++;
        g->plan_seconds += lc_now() - t0;
        if (rc == CUBLAS_STATUS_NOT_SUPPORTED) /* the callers fall back; ask once per shape */
            *p = (lc_gemm_plan){.valid = true, .unsupported = true, .m = M, .n = N, .k = K,
                                .dt = (int)dt, .out_f32 = out_f32, .kind = kind};
        if (rc) return rc;
    } else if (p->unsupported) {
        if (msg && msg_size)
            snprintf(msg, msg_size, "cuBLASLt has no algorithm for GEMM M=%d N=%d K=%d (kind %d)", M, N, K, kind);
        return CUBLAS_STATUS_NOT_SUPPORTED;
    } else if (lc_lt_vec(kind)) {
        cublasStatus_t st = lc_set_scales(p, sa, sb);
        if (st != CUBLAS_STATUS_SUCCESS) {
            if (msg && msg_size)
                snprintf(msg, msg_size, "setting the FP8 scale vectors failed with cuBLAS status %d "
                         "for GEMM M=%d N=%d K=%d", (int)st, M, N, K);
            return (int)st;
        }
    }
    const void *alpha = p->int_scale ? (const void *)&lc_one_i : (const void *)&lc_one_f;
    const void *beta = p->int_scale ? (const void *)&lc_zero_i : (const void *)&lc_zero_f;
    cublasStatus_t st = cublasLtMatmul(g->lt, p->op, alpha, w, p->la, x, p->lb, beta, y, p->lc,
                                       y, p->lc, &p->algo, g->ws, g->ws_bytes, s);
    if (st != CUBLAS_STATUS_SUCCESS) {
        if (msg && msg_size)
            snprintf(msg, msg_size, "cublasLtMatmul failed with cuBLAS status %d for GEMM M=%d "
                     "N=%d K=%d", (int)st, M, N, K);
        return (int)st;
    }
    return 0;
}

int loom_cuda_gemm_run(loom_cuda_gemm *g, loom_cuda_dt dt, int out_f32, int M, int N, int K,
                       const void *x, const void *w, void *y, cudaStream_t s, char *msg,
                       size_t msg_size) {
    if (M <= 0) return 0;
    out_f32 = out_f32 ? 1 : 0;
    if (g->invariant) {
        cudaError_t e = K % 8 ? cudaErrorInvalidValue : lc_gemv_rows(dt, out_f32, M, N, K, x, w, y, s);
        if (e != cudaSuccess && msg && msg_size)
            snprintf(msg, msg_size, "batch-invariant gemv failed for M=%d N=%d K=%d%s: %s", M, N, K,
                     K % 8 ? " (needs K % 8 == 0)" : "", cudaGetErrorString(e));
        return e == cudaSuccess ? 0 : 10000 + (int)e;
    }
    if (M <= g->gemv_max_m && K % 8 == 0) {
        cudaError_t e = lc_gemv(dt, out_f32, M, N, K, x, w, y, s);
        if (e != cudaSuccess && msg && msg_size)
            snprintf(msg, msg_size, "gemv kernel launch failed for M=%d N=%d K=%d: %s", M, N, K,
                     cudaGetErrorString(e));
        return e == cudaSuccess ? 0 : 10000 + (int)e;
    }
    return lc_lt_run(g, 0, dt, out_f32, M, N, K, x, w, y, NULL, NULL, s, msg, msg_size);
}

int lc_gemm_run_lt(loom_cuda_gemm *g, loom_cuda_dt dt, int out_f32, int M, int N, int K,
                   const void *x, const void *w, void *y, cudaStream_t s, char *msg,
                   size_t msg_size) {
    if (M <= 0) return 0;
    return lc_lt_run(g, 0, dt, out_f32 ? 1 : 0, M, N, K, x, w, y, NULL, NULL, s, msg, msg_size);
}

int lc_gemm_lt_q(loom_cuda_gemm *g, int kind, int M, int N, int K, const void *xq,
                 const void *wq, const float *sx, const float *sw, void *d, cudaStream_t s,
                 char *msg, size_t msg_size) {
    if (M <= 0) return 0;
    return lc_lt_run(g, kind, LOOM_CUDA_BF16, 0, M, N, K, xq, wq, d, sw, sx, s, msg, msg_size);
}

int lc_gemm_fp8_vec(const loom_cuda_gemm *g) { return g->fp8_vec; }
void lc_gemm_set_fp8_vec(loom_cuda_gemm *g, int on) { g->fp8_vec = on ? 1 : 0; }
int lc_gemm_fp8_vec_min_m(const loom_cuda_gemm *g) { return g->fp8_vec_min_m; }
void loom_cuda_qgemm_set_fp8_vec_min_m(loom_cuda_gemm *g, int min_m) {
    g->fp8_vec_min_m = min_m < 0 ? 0 : min_m > 65536 ? 65536 : min_m;
}

int lc_gemm_q_gemv_max_m(const loom_cuda_gemm *g, loom_cuda_qfmt fmt) {
    if (fmt <= 0 || fmt > LOOM_CUDA_Q_GGUF) return 0;
    return g->invariant ? INT_MAX : g->q_gemv_max_m[fmt];
}

void loom_cuda_qgemm_set_gemv_max_m(loom_cuda_gemm *g, loom_cuda_qfmt fmt, int max_m) {
    if (fmt <= 0 || fmt > LOOM_CUDA_Q_GGUF) return;
    g->q_gemv_max_m[fmt] = max_m < 0 ? 0 : max_m > 256 ? 256 : max_m;
}

int lc_gemm_q_tc_min_m(const loom_cuda_gemm *g) { return g->q_tc_min_m; }

int lc_gemm_q_tiled_max_m(const loom_cuda_gemm *g) { return g->invariant ? LC_QT_MAX_M : g->q_tiled_max_m; }

void loom_cuda_qgemm_set_tiled_max_m(loom_cuda_gemm *g, int max_m) {
    g->q_tiled_max_m = max_m < 0 ? 0 : max_m > LC_QT_CHUNKED_MAX_M ? LC_QT_CHUNKED_MAX_M : max_m;
}

int lc_gemm_q_tiled_wg_min_m(const loom_cuda_gemm *g) { return g->q_tiled_wg_min_m; }

void loom_cuda_qgemm_set_tiled_wgmma_min_m(loom_cuda_gemm *g, int min_m) {
    g->q_tiled_wg_min_m = min_m <= 0 ? 0 : min_m < 2 ? 2 : min_m > LC_QT_MAX_M + 1 ? LC_QT_MAX_M + 1 : min_m;
}

void loom_cuda_qgemm_set_tc_min_m(loom_cuda_gemm *g, int min_m) {
    g->q_tc_min_m = min_m < 0 ? 0 : min_m > LC_QGEMV_MAX_M + 1 ? LC_QGEMV_MAX_M + 1 : min_m;
}

int loom_cuda_gemm_swiglu_run(loom_cuda_gemm *g, loom_cuda_dt dt, int M, int N, int I, const void *gu,
                              const void *w, void *act, void *y, cudaStream_t s, char *msg, size_t msg_size) {
    if (M <= 0) return 0;
    /* Two kernels, not a GEMV that forms silu(gate) * up in its loads: every
     * warp of that one recomputed silu over the whole row (N * I * M
     * evaluations) and measured slower on an H200 (engine TPOT: 45 us a
     * layer lost for Llama-3-8B's 4096 x 14336 at M = 1; SmolLM2 0.76 ->
     * 0.79 ms at M = 1, 1.11 -> 1.98 ms at M = 8). A one-token step fuses
     * SwiGLU into the gate|up GEMV instead (loom_cuda_epi). */
    cudaError_t e = loom_cuda_swiglu(dt, act, gu, M, I, s);
    if (e != cudaSuccess) {
        if (msg && msg_size) snprintf(msg, msg_size, "swiglu launch failed: %s", cudaGetErrorString(e));
        return 10000 + (int)e;
    }
    return loom_cuda_gemm_run(g, dt, 0, M, N, I, act, w, y, s, msg, msg_size);
}

int lc_epi_separate(loom_cuda_dt dt, int M, int N, void *y, const loom_cuda_epi *epi, cudaStream_t s, char *msg,
                    size_t msg_size) {
    cudaError_t e = cudaSuccess;
    if (epi->kind == LOOM_CUDA_EPI_ROPE_KV)
        e = loom_cuda_rope_kv(dt, epi->kv, y, N, epi->bias, epi->cs, epi->pos, epi->slot, epi->k_cache, epi->v_cache,
                              M, epi->num_heads, epi->num_kv_heads, epi->head_dim, epi->block_size, s);
    else if (epi->kind == LOOM_CUDA_EPI_SWIGLU)
        e = N % 2 ? cudaErrorInvalidValue : loom_cuda_swiglu(dt, epi->act, y, M, N / 2, s);
    if (e != cudaSuccess && msg && msg_size)
        snprintf(msg, msg_size, "%s launch after the GEMM (M=%d N=%d) failed: %s",
                 epi->kind == LOOM_CUDA_EPI_ROPE_KV ? "rope_kv" : "swiglu", M, N, cudaGetErrorString(e));
    return e == cudaSuccess ? 0 : 10000 + (int)e;
}

int loom_cuda_gemm_epi_run(loom_cuda_gemm *g, loom_cuda_dt dt, int M, int N, int K, const void *x, const void *w,
                           void *y, const loom_cuda_epi *epi, cudaStream_t s, char *msg, size_t msg_size) {
    if (M <= 0) return 0;
    if (!epi || epi->kind == LOOM_CUDA_EPI_NONE) return loom_cuda_gemm_run(g, dt, 0, M, N, K, x, w, y, s, msg, msg_size);
    /* the one-row GEMV, which loom_cuda_gemm_run would run here too (also
     * in batch-invariant mode: its M = 1 rows are the same kernel's) */
    if (M == 1 && (g->invariant || M <= g->gemv_max_m) && K % 8 == 0) {
        cudaError_t e = lc_gemv_epi(dt, N, K, x, w, y, epi, s);
        if (e == cudaSuccess) return 0;
        if (e != cudaErrorNotSupported) {
            if (msg && msg_size)
                snprintf(msg, msg_size, "gemv kernel (fused epilogue) launch failed for N=%d K=%d: %s", N, K,
                         cudaGetErrorString(e));
            return 10000 + (int)e;
        }
        /* declined (rows that do not pair): nothing was launched */
    }
    const int rc = loom_cuda_gemm_run(g, dt, 0, M, N, K, x, w, y, s, msg, msg_size);
    return rc ? rc : lc_epi_separate(dt, M, N, y, epi, s, msg, msg_size);
}

void loom_cuda_gemm_set_gemv_max_m(loom_cuda_gemm *g, int max_m) {
    g->gemv_max_m = max_m < 0 ? 0 : max_m > LC_GEMV_MAX_M ? LC_GEMV_MAX_M : max_m;
}


void loom_cuda_gemm_set_batch_invariant(loom_cuda_gemm *g, int on) { g->invariant = on ? 1 : 0; }
int lc_gemm_invariant(const loom_cuda_gemm *g) { return g->invariant; }
