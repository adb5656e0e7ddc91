/*
 * kernels/cpu/elementwise.c — row-wise kernels: RMSNorm (plain, fused
 * with the residual add, of the normed output added to the residual, per
 * head), SwiGLU, tanh GeGLU, scaling, embedding lookup, and e^x (vexp.h's,
 * for the tests).
 *
 * Rows are split over the pool only when a call is big enough (prefill);
 * a decode step's single row is cheaper to do inline than to wake a thread.
 * Sums of squares accumulate in float64: it costs nothing next to the loads
 * and keeps RMSNorm within a few ulps of a float64 reference at any width.
 */
#include "cpu_kernels.h"
#include "vexp.h"

#include <math.h>
#include <string.h>

/* Below this many elements a call runs on the calling thread. */
#define ELEM_PARALLEL_MIN 32768

static int64_t elem_grain(int64_t row_elems) {
    int64_t g = 16384 / (row_elems > 0 ? row_elems : 1);
    return g < 1 ? 1 : g;
}

/* ---------------------------------------------------------------- RMSNorm */

/* 1 / sqrt(mean(x^2) + eps) over x (N). */
static float rms_inv(const float *x, int64_t N, float eps) {
    double acc[8] = {0};
    int64_t i = 0;
    for (; i + 8 <= N; i += 8)
        for (int j = 0; j < 8; j++) acc[j] += (double)x[i + j] * x[i + j];
    double ss = 0;
    for (int j = 0; j < 8; j++) ss += acc[j];
    for (; i < N; i++) ss += (double)x[i] * x[i];
    return (float)(1.0 / sqrt(ss / (double)N + (double)eps));
}

typedef struct rmsnorm_ctx {
    float *y;
    int64_t ldy;
    float *x;           /* updated in place by the fused variant          */
    int64_t ldx;
    const float *r;     /* residual to add first, or NULL                 */
    const float *w;
    int64_t N;
    float eps;
} rmsnorm_ctx;

static void rmsnorm_rows(void *arg, int64_t b, int64_t e, int worker) {
    (void)worker;
    const rmsnorm_ctx *c = arg;
    for (int64_t t = b; t < e; t++) {
        float *x = c->x + t * c->ldx;
        float *y = c->y + t * c->ldy;
        if (c->r) {
            const float *r = c->r + t * c->N;
            for (int64_t i = 0; i < c->N; i++) x[i] += r[i];
        }
        float inv = rms_inv(x, c->N, c->eps);
        for (int64_t i = 0; i < c->N; i++) y[i] = x[i] * inv * c->w[i];
    }
}

void loom_cpu_rmsnorm(float *y, int64_t ldy, const float *x, int64_t ldx, const float *w,
                      int64_t T, int64_t N, float eps, loom_cpu_pool *pool) {
    /* x is only read here (r is NULL), so dropping const is safe. */
    rmsnorm_ctx c = {.y = y, .ldy = ldy, .x = (float *)x, .ldx = ldx, .r = NULL, .w = w, .N = N,
                     .eps = eps};
    if (T * N < ELEM_PARALLEL_MIN) pool = NULL;
    loom_cpu_pool_for(pool, T, elem_grain(N), rmsnorm_rows, &c);
}

void loom_cpu_add_rmsnorm(float *y, float *x, const float *r, const float *w, int64_t T,
                          int64_t N, float eps, loom_cpu_pool *pool) {
    rmsnorm_ctx c = {.y = y, .ldy = N, .x = x, .ldx = N, .r = r, .w = w, .N = N, .eps = eps};
    if (T * N < ELEM_PARALLEL_MIN) pool = NULL;
    loom_cpu_pool_for(pool, T, elem_grain(N), rmsnorm_rows, &c);
}

/* ----------------------------------------------------------------- SwiGLU */

typedef struct swiglu_ctx {
    float *out;
    const float *gate, *up;
    int64_t ldg, ldu, I;
} swiglu_ctx;

/* Built for x86-64-v4 / v3 / baseline, picked at load (the vector exp and
 * the division run 8 lanes wide). */
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#define ELEM_CLONES __attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default")))
#else
#define ELEM_CLONES
#endif

/* silu(g) u over 8 lanes: g / (1 + e^-g) u (e^-g = inf gives -0, not NaN) */
static inline __attribute__((always_inline)) loom_v8f swiglu8(loom_v8f g, loom_v8f u) {
    return g / (1.0f + loom_v8_exp(-g)) * u;
}

/* 0.5 g (1 + tanh(y)) u with y = sqrt(2/pi) (g + 0.044715 g^3), written as
 * g / (1 + e^-2y) u (the same function: 1 + tanh(y) = 2 / (1 + e^-2y)),
 * which keeps its relative precision where tanh(y) nears -1 and needs one
 * exp; e^-2y = inf gives -0, as tanh's form does. */
static inline __attribute__((always_inline)) loom_v8f geglu8(loom_v8f g, loom_v8f u) {
    const loom_v8f y = 0.7978845608028654f * (g + 0.044715f * g * g * g);
    return g / (1.0f + loom_v8_exp(-2.0f * y)) * u;
}

/* out = act(gate) * up, a row at a time, 8 lanes a step (act a constant
 * after inlining: 0 silu, 1 tanh GELU). */
static inline __attribute__((always_inline)) void glu_rows(const swiglu_ctx *c, int64_t b, int64_t e,
                                                           const int gelu) {
    const int64_t I = c->I, I8 = I & ~(int64_t)7;
    for (int64_t t = b; t < e; t++) {
        const float *g = c->gate + t * c->ldg;
        const float *u = c->up + t * c->ldu;
        float *o = c->out + t * I;
        loom_v8f gv, uv;
        for (int64_t i = 0; i < I8; i += 8) {
            memcpy(&gv, g + i, sizeof gv), memcpy(&uv, u + i, sizeof uv);
            gv = gelu ? geglu8(gv, uv) : swiglu8(gv, uv);
            memcpy(o + i, &gv, sizeof gv);
        }
        if (I8 < I) { /* the tail through the same lanes, zero-padded */
            gv = uv = (loom_v8f){0};
            memcpy(&gv, g + I8, (size_t)(I - I8) * sizeof(float));
            memcpy(&uv, u + I8, (size_t)(I - I8) * sizeof(float));
            gv = gelu ? geglu8(gv, uv) : swiglu8(gv, uv);
            memcpy(o + I8, &gv, (size_t)(I - I8) * sizeof(float));
        }
    }
}

ELEM_CLONES
static void swiglu_rows(void *arg, int64_t b, int64_t e, int worker) {
    (void)worker;
    glu_rows(arg, b, e, 0);
}

ELEM_CLONES
static void geglu_rows(void *arg, int64_t b, int64_t e, int worker) {
    (void)worker;
    glu_rows(arg, b, e, 1);
}

ELEM_CLONES
void loom_cpu_exp(float *y, const float *x, int64_t n) {
    loom_v8f v;
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) {
        memcpy(&v, x + i, sizeof v);
        v = loom_v8_exp(v);
        memcpy(y + i, &v, sizeof v);
    }
    if (i < n) {
        v = (loom_v8f){0};
        memcpy(&v, x + i, (size_t)(n - i) * sizeof(float));
        v = loom_v8_exp(v);
        memcpy(y + i, &v, (size_t)(n - i) * sizeof(float));
    }
}

void loom_cpu_swiglu(float *out, const float *gate, int64_t ldg, const float *up, int64_t ldu,
                     int64_t T, int64_t I, loom_cpu_pool *pool) {
    swiglu_ctx c = {.out = out, .gate = gate, .up = up, .ldg = ldg, .ldu = ldu, .I = I};
    if (T * I < ELEM_PARALLEL_MIN) pool = NULL;
    loom_cpu_pool_for(pool, T, elem_grain(I), swiglu_rows, &c);
}

/* ------------------------------------------------------- Gemma's variants */

typedef struct addnorm_ctx {
    float *x;
    const float *r, *w;
    int64_t N;
    float eps;
} addnorm_ctx;

static void add_normed_rows(void *arg, int64_t b, int64_t e, int worker) {
    (void)worker;
    const addnorm_ctx *c = arg;
    for (int64_t t = b; t < e; t++) {
        const float *r = c->r + t * c->N;
        float *x = c->x + t * c->N;
        float inv = rms_inv(r, c->N, c->eps);
        for (int64_t i = 0; i < c->N; i++) x[i] += r[i] * inv * c->w[i];
    }
}

void loom_cpu_add_normed(float *x, const float *r, const float *w, int64_t T, int64_t N, float eps,
                         loom_cpu_pool *pool) {
    addnorm_ctx c = {.x = x, .r = r, .w = w, .N = N, .eps = eps};
    if (T * N < ELEM_PARALLEL_MIN) pool = NULL;
    loom_cpu_pool_for(pool, T, elem_grain(N), add_normed_rows, &c);
}

void loom_cpu_head_rmsnorm(float *x, int64_t ldx, int64_t T, int32_t n_heads, int32_t D, const float *w,
                           float eps, loom_cpu_pool *pool) {
    for (int32_t h = 0; h < n_heads; h++)
        loom_cpu_rmsnorm(x + (int64_t)h * D, ldx, x + (int64_t)h * D, ldx, w, T, D, eps, pool);
}

void loom_cpu_geglu_tanh(float *out, const float *gate, int64_t ldg, const float *up, int64_t ldu,
                         int64_t T, int64_t I, loom_cpu_pool *pool) {
    swiglu_ctx c = {.out = out, .gate = gate, .up = up, .ldg = ldg, .ldu = ldu, .I = I};
    if (T * I < ELEM_PARALLEL_MIN) pool = NULL;
    loom_cpu_pool_for(pool, T, elem_grain(I), geglu_rows, &c);
}

void loom_cpu_scale(float *x, int64_t n, float s) {
    for (int64_t i = 0; i < n; i++) x[i] *= s;
}

/* -------------------------------------------------------------- embedding */

void loom_cpu_embedding(float *out, const float *table, const int32_t *ids, int64_t T, int64_t N) {
    for (int64_t t = 0; t < T; t++)
        memcpy(out + t * N, table + (int64_t)ids[t] * N, (size_t)N * sizeof(float));
}
