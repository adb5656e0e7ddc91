/*
 * tests/kernels/test_cpu_kernels.c — every kernel in kernels/cpu against a
 * float64 reference written plainly here, on fresh random inputs (seed
 * printed; LOOM_TEST_SEED replays) and many shapes: ragged sequence lengths
 * around block boundaries, GQA ratios 1/3/4/8, head_dim 64 and 128, strided
 * rows, f32 and f16 KV caches, with and without the thread pool.
 *
 * Error measure (METHOD): max |kernel - reference| / max |reference| over the
 * whole output; float32 kernels must stay under 1e-5 (float16 KV is compared
 * to a reference that reads the same float16-rounded K/V, so it meets the
 * same bound).
 */
#include <criterion/criterion.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "cpu_kernels.h"
#include "rng.h"
#include "formats/dtype.h"

#define F32_TOL 1e-5

/* max-tracking that lets no NaN through (fmax would drop it) */
static inline double err_max(double acc, double d) { return d != d ? INFINITY : fmax(acc, d); }

static void *xmalloc(size_t n) {
    void *p = malloc(n ? n : 1);
    cr_assert(p, "out of memory (%zu bytes)", n);
    return p;
}

/* ------------------------------------------------------------- pool */

typedef struct pool_probe {
    int *hits;    /* (n) times each item ran */
    int64_t n;
} pool_probe;

static void pool_probe_fn(void *arg, int64_t b, int64_t e, int worker) {
    pool_probe *p = arg;
    (void)worker;
    for (int64_t i = b; i < e; i++) __atomic_add_fetch(&p->hits[i], 1, __ATOMIC_RELAXED);
}

Test(kernels, pool_covers_every_item_once) {
    int threads[] = {1, 2, 3, 5};
    int64_t sizes[] = {1, 2, 7, 64, 1000, 4097};
    for (size_t ti = 0; ti < sizeof threads / sizeof *threads; ti++) {
        loom_cpu_pool *pool = loom_cpu_pool_create(threads[ti]);
        cr_assert(pool);
        cr_assert_eq(loom_cpu_pool_size(pool), threads[ti]);
        for (int rep = 0; rep < 50; rep++)
            for (size_t si = 0; si < sizeof sizes / sizeof *sizes; si++) {
                int64_t n = sizes[si];
                int *hits = calloc((size_t)n, sizeof *hits);
                pool_probe p = {hits, n};
                loom_cpu_pool_for(pool, n, 1 + rep % 5, pool_probe_fn, &p);
                for (int64_t i = 0; i < n; i++)
                    cr_assert_eq(hits[i], 1, "threads %d n %lld item %lld ran %d times",
                                 threads[ti], (long long)n, (long long)i, hits[i]);
                free(hits);
            }
        loom_cpu_pool_destroy(pool);
    }
    loom_cpu_pool_destroy(NULL);
    cr_assert_eq(loom_cpu_pool_size(NULL), 1);
}

/* Back-to-back small jobs on more threads than cores: workers wake late,
 * after the caller finished a job alone, and must claim nothing of it (nor
 * of the next one with the old job's callback). */
Test(kernels, pool_late_workers_claim_nothing_stale) {
    loom_cpu_pool *pool = loom_cpu_pool_create(8);
    cr_assert(pool);
    int hits[64];
    for (int rep = 0; rep < 20000; rep++) {
        const int64_t n = 2 + rep % 63;
        memset(hits, 0, sizeof hits);
        pool_probe p = {hits, n};
        loom_cpu_pool_for(pool, n, 1, pool_probe_fn, &p);
        for (int64_t i = 0; i < n; i++)
            cr_assert_eq(hits[i], 1, "job %d: item %lld ran %d times", rep, (long long)i, hits[i]);
    }
    loom_cpu_pool_destroy(pool);
}

/* ------------------------------------------------------------- RMSNorm */

static void ref_rmsnorm(double *y, const float *x, const float *w, int64_t N, double eps) {
    double ss = 0;
    for (int64_t i = 0; i < N; i++) ss += (double)x[i] * x[i];
    double r = 1.0 / sqrt(ss / N + eps);
    for (int64_t i = 0; i < N; i++) y[i] = x[i] * r * w[i];
}

Test(kernels, rmsnorm) {
    test_rng r = rng_seeded("kernels.rmsnorm");
    loom_cpu_pool *pool = loom_cpu_pool_create(2);
    int64_t Ns[] = {1, 7, 64, 576, 4096};
    int64_t Ts[] = {1, 3, 17, 64};
    for (size_t a = 0; a < 5; a++)
        for (size_t b = 0; b < 4; b++) {
            int64_t N = Ns[a], T = Ts[b], ldx = N + 3, ldy = N + 5;
            float eps = 1e-5f;
            float *x = xmalloc(sizeof(float) * T * ldx), *y = xmalloc(sizeof(float) * T * ldy);
            float *w = xmalloc(sizeof(float) * N);
            double *ref = xmalloc(sizeof(double) * T * N);
            rng_fill(&r, x, T * ldx, rng_range(&r, 0.01, 10));
            for (int64_t i = 0; i < N; i++) w[i] = (float)(1 + 0.3 * rng_normal(&r));
            for (int64_t i = 0; i < T * ldy; i++) y[i] = 12345.f;
            loom_cpu_rmsnorm(y, ldy, x, ldx, w, T, N, eps, b % 2 ? pool : NULL);
            double num = 0, den = 1e-30;
            for (int64_t t = 0; t < T; t++) {
                ref_rmsnorm(ref + t * N, x + t * ldx, w, N, eps);
                for (int64_t i = 0; i < N; i++) {
                    num = err_max(num, fabs(y[t * ldy + i] - ref[t * N + i]));
                    den = fmax(den, fabs(ref[t * N + i]));
                }
                for (int64_t i = N; i < ldy; i++) cr_assert_eq(y[t * ldy + i], 12345.f, "pad written");
            }
            cr_assert_lt(num / den, F32_TOL, "rmsnorm T %lld N %lld: rel err %g", (long long)T,
                         (long long)N, num / den);
            free(x), free(y), free(w), free(ref);
        }
    loom_cpu_pool_destroy(pool);
}

Test(kernels, add_rmsnorm) {
    test_rng r = rng_seeded("kernels.add_rmsnorm");
    loom_cpu_pool *pool = loom_cpu_pool_create(2);
    int64_t Ns[] = {5, 64, 576};
    int64_t Ts[] = {1, 9, 100};
    for (size_t a = 0; a < 3; a++)
        for (size_t b = 0; b < 3; b++) {
            int64_t N = Ns[a], T = Ts[b];
            float *x = xmalloc(sizeof(float) * T * N), *res = xmalloc(sizeof(float) * T * N);
            float *y = xmalloc(sizeof(float) * T * N), *w = xmalloc(sizeof(float) * N);
            float *x0 = xmalloc(sizeof(float) * T * N), *xs = xmalloc(sizeof(float) * N);
            double *ref = xmalloc(sizeof(double) * N);
            rng_fill(&r, x, T * N, 2);
            rng_fill(&r, res, T * N, 2);
            rng_fill(&r, w, N, 1);
            memcpy(x0, x, sizeof(float) * T * N);
            loom_cpu_add_rmsnorm(y, x, res, w, T, N, 1e-6f, pool);
            double num = 0, den = 1e-30;
            for (int64_t t = 0; t < T; t++) {
                for (int64_t i = 0; i < N; i++) {
                    xs[i] = x0[t * N + i] + res[t * N + i]; /* float sum, as the kernel */
                    cr_assert_eq(x[t * N + i], xs[i], "residual sum not stored in x");
                }
                ref_rmsnorm(ref, xs, w, N, 1e-6);
                for (int64_t i = 0; i < N; i++) {
                    num = err_max(num, fabs(y[t * N + i] - ref[i]));
                    den = fmax(den, fabs(ref[i]));
                }
            }
            cr_assert_lt(num / den, F32_TOL, "add_rmsnorm rel err %g", num / den);
            free(x), free(res), free(y), free(w), free(x0), free(xs), free(ref);
        }
    loom_cpu_pool_destroy(pool);
}

/* ------------------------------------------------------------- exp */

/* Error of y against e^x in units in the last place of the float32 nearest
 * e^x (subnormal results: of the smallest subnormal). */
static double exp_ulps(float y, float x) {
    double ref = exp((double)x);
    int e = ref >= 0x1p-126 ? ilogb(ref) : -126;
    return fabs((double)y - ref) / ldexp(1.0, e - 23);
}

/* loom_cpu_exp (the vector exp of attention's softmax and SwiGLU) over the
 * whole float range of e^x in steps finer than an ulp of the argument's
 * scale, against float64 exp and libm's expf; special values exactly. */
Test(kernels, exp) {
    test_rng r = rng_seeded("kernels.exp");
    const int64_t n = 1 << 20;
    float *x = xmalloc(sizeof(float) * n), *y = xmalloc(sizeof(float) * n);
    double worst = 0, worst_libm = 0;
    float at = 0;
    for (int pass = 0; pass < 4; pass++) {
        /* pass 0: an even sweep of [-104, 89]; 1: random in [-1, 1] (the
         * softmax's usual range); 2: random in [-88, 0]; 3: near the edges */
        for (int64_t i = 0; i < n; i++) {
            double u = rng_unif(&r);
            x[i] = pass == 0 ? (float)(-104.0 + 193.0 * (double)i / (double)(n - 1))
                 : pass == 1 ? (float)(2 * u - 1)
                 : pass == 2 ? (float)(-88.0 * u)
                 : (float)(i % 2 ? 88.0 + 0.73 * u : -87.0 - 17.0 * u);
        }
        loom_cpu_exp(y, x, n - pass); /* odd lengths: the zero-padded tail */
        for (int64_t i = 0; i < n - pass; i++) {
            double ref = exp((double)x[i]);
            if (ref > 0x1.fffffep127) { /* beyond FLT_MAX: overflows */
                if (ref > 0x1.ffffffp127) cr_assert(isinf(y[i]) && y[i] > 0, "e^%a = %a, want inf", (double)x[i], (double)y[i]);
                continue;
            }
            double u = exp_ulps(y[i], x[i]);
            if (u > worst) worst = u, at = x[i];
            worst_libm = fmax(worst_libm, exp_ulps(expf(x[i]), x[i]));
        }
    }
    cr_assert_leq(worst, 2.0, "vector exp is %.2f ulp off at x = %a (libm expf: %.2f ulp)", worst,
                  (double)at, worst_libm);
    /* specials: e^0 = 1 exactly (the online softmax compares corr with 1) */
    const float sx[] = {0.0f, -0.0f, -INFINITY, INFINITY, NAN, -1000.0f, 1000.0f, -110.0f, 89.0f};
    float sy[9];
    loom_cpu_exp(sy, sx, 9);
    cr_assert_eq(sy[0], 1.0f);
    cr_assert_eq(sy[1], 1.0f);
    cr_assert_eq(sy[2], 0.0f, "e^-inf = %a", (double)sy[2]);
    cr_assert(isinf(sy[3]) && sy[3] > 0, "e^inf = %a", (double)sy[3]);
    cr_assert(isnan(sy[4]), "e^NaN = %a", (double)sy[4]);
    cr_assert_eq(sy[5], 0.0f, "e^-1000 = %a", (double)sy[5]);
    cr_assert(isinf(sy[6]) && sy[6] > 0, "e^1000 = %a", (double)sy[6]);
    cr_assert_eq(sy[7], 0.0f, "e^-110 = %a", (double)sy[7]);
    cr_assert(isinf(sy[8]), "e^89 = %a", (double)sy[8]);
    /* in place */
    float ip[3] = {1.0f, 2.0f, -3.0f};
    loom_cpu_exp(ip, ip, 3);
    cr_assert(exp_ulps(ip[0], 1.0f) <= 2.0 && exp_ulps(ip[1], 2.0f) <= 2.0 && exp_ulps(ip[2], -3.0f) <= 2.0);
    cr_log_info("vector exp: %.3f ulp at most (x = %a); libm expf %.3f", worst, (double)at, worst_libm);
    free(x), free(y);
}

/* ------------------------------------------------------------- SwiGLU */

Test(kernels, swiglu) {
    test_rng r = rng_seeded("kernels.swiglu");
    loom_cpu_pool *pool = loom_cpu_pool_create(3);
    int64_t Is[] = {1, 7, 1536};
    int64_t Ts[] = {1, 5, 40};
    for (size_t a = 0; a < 3; a++)
        for (size_t b = 0; b < 3; b++) {
            int64_t I = Is[a], T = Ts[b], ld = 2 * I + 3;
            float *gu = xmalloc(sizeof(float) * T * ld), *out = xmalloc(sizeof(float) * T * I);
            rng_fill(&r, gu, T * ld, 3);
            for (int64_t i = 0; i < T * I; i++) out[i] = NAN; /* poison: every element written */
            gu[0] = -100.f; /* e^100 overflows float: silu must still be -0 */
            if (T * ld > 2) gu[1] = 90.f;
            loom_cpu_swiglu(out, gu, ld, gu + I, ld, T, I, pool);
            double num = 0, den = 1e-30;
            for (int64_t t = 0; t < T; t++)
                for (int64_t i = 0; i < I; i++) {
                    double g = gu[t * ld + i], u = gu[t * ld + I + i];
                    double ref = g / (1 + exp(-g)) * u;
                    num = err_max(num, fabs(out[t * I + i] - ref));
                    den = fmax(den, fabs(ref));
                    cr_assert(isfinite(out[t * I + i]), "non-finite swiglu at %lld,%lld",
                              (long long)t, (long long)i);
                }
            cr_assert_lt(num / den, F32_TOL, "swiglu T %lld I %lld rel err %g", (long long)T,
                         (long long)I, num / den);
            free(gu), free(out);
        }
    loom_cpu_pool_destroy(pool);
}

Test(kernels, geglu_tanh) {
    test_rng r = rng_seeded("kernels.geglu_tanh");
    loom_cpu_pool *pool = loom_cpu_pool_create(3);
    const int64_t T = 33, sizes[] = {2048, 13}; /* 13: the zero-padded tail lanes */
    for (int n = 0; n < 2; n++) {
        const int64_t I = sizes[n], ld = 2 * I + 1;
        float *gu = xmalloc(sizeof(float) * T * ld), *out = xmalloc(sizeof(float) * T * I);
        rng_fill(&r, gu, T * ld, 4);
        gu[0] = -60.f, gu[1] = 60.f; /* saturated: -0 and g */
        loom_cpu_geglu_tanh(out, gu, ld, gu + I, ld, T, I, pool);
        double num = 0, den = 1e-30;
        for (int64_t t = 0; t < T; t++)
            for (int64_t i = 0; i < I; i++) {
                double g = gu[t * ld + i], u = gu[t * ld + I + i];
                double ref = 0.5 * g * (1 + tanh(sqrt(2 / M_PI) * (g + 0.044715 * g * g * g))) * u;
                num = err_max(num, fabs(out[t * I + i] - ref));
                den = fmax(den, fabs(ref));
            }
        cr_assert_lt(num / den, F32_TOL, "geglu_tanh I=%lld rel err %g", (long long)I, num / den);
        free(gu), free(out);
    }
    /* each value to its own relative precision where 1 + tanh(y) is tiny
     * (g = -6: 2.8e-11 of g), which 0.5 g (1 + tanhf(y)) in float loses;
     * the reference is the same function as g / (1 + e^-2y) in float64,
     * since 1 + tanh(y) loses it in float64 too from g = -7 */
    float g[8] = {-1.f, -2.f, -3.f, -4.f, -5.f, -6.f, -7.f, -8.f}, u[8], o[8];
    for (int i = 0; i < 8; i++) u[i] = 1.f;
    loom_cpu_geglu_tanh(o, g, 8, u, 8, 1, 8, NULL);
    for (int i = 0; i < 8; i++) {
        const double x = g[i], ref = x / (1 + exp(-2 * sqrt(2 / M_PI) * (x + 0.044715 * x * x * x)));
        cr_assert_lt(fabs(o[i] - ref), 1e-5 * fabs(ref), "geglu_tanh(%g) = %g, want %g", x, (double)o[i], ref);
    }
    loom_cpu_pool_destroy(pool);
}

/* Gemma's norms: every head of a strided (T, heads, D) row normed in place,
 * and x += rmsnorm(r) * w. */
Test(kernels, head_rmsnorm_and_add_normed) {
    test_rng r = rng_seeded("kernels.head_rmsnorm_and_add_normed");
    const int64_t T = 7, NH = 3, D = 256, ld = NH * D + 9, N = 640;
    float *x = xmalloc(sizeof(float) * T * ld), *x0 = xmalloc(sizeof(float) * T * ld);
    float *w = xmalloc(sizeof(float) * N);
    double y[640];
    rng_fill(&r, x, T * ld, 3);
    rng_fill(&r, w, N, 2);
    memcpy(x0, x, sizeof(float) * T * ld);
    loom_cpu_head_rmsnorm(x, ld, T, (int32_t)NH, (int32_t)D, w, 1e-6f, NULL);
    double num = 0, den = 1e-30;
    for (int64_t t = 0; t < T; t++) {
        for (int64_t h = 0; h < NH; h++) {
            ref_rmsnorm(y, x0 + t * ld + h * D, w, D, 1e-6);
            for (int64_t e = 0; e < D; e++) {
                num = err_max(num, fabs(x[t * ld + h * D + e] - y[e]));
                den = fmax(den, fabs(y[e]));
            }
        }
        for (int64_t e = NH * D; e < ld; e++) cr_assert_eq(x[t * ld + e], x0[t * ld + e], "wrote past the heads");
    }
    cr_assert_lt(num / den, F32_TOL, "head_rmsnorm rel err %g", num / den);
    float *res = xmalloc(sizeof(float) * T * N), *add = xmalloc(sizeof(float) * T * N);
    rng_fill(&r, res, T * N, 2);
    rng_fill(&r, add, T * N, 5);
    memcpy(x0, res, sizeof(float) * T * N);
    loom_cpu_add_normed(res, add, w, T, N, 1e-6f, NULL);
    num = 0, den = 1e-30;
    for (int64_t t = 0; t < T; t++) {
        ref_rmsnorm(y, add + t * N, w, N, 1e-6);
        for (int64_t e = 0; e < N; e++) {
            double ref = x0[t * N + e] + y[e];
            num = err_max(num, fabs(res[t * N + e] - ref));
            den = fmax(den, fabs(ref));
        }
    }
    cr_assert_lt(num / den, F32_TOL, "add_normed rel err %g", num / den);
    free(x), free(x0), free(w), free(res), free(add);
}

/* ------------------------------------------------------------- embedding */

Test(kernels, embedding) {
    test_rng r = rng_seeded("kernels.embedding");
    int64_t V = 97, N = 40, T = 23;
    float *table = xmalloc(sizeof(float) * V * N), *out = xmalloc(sizeof(float) * T * N);
    int32_t ids[23];
    rng_fill(&r, table, V * N, 1);
    for (int64_t t = 0; t < T; t++) ids[t] = (int32_t)(t == 0 ? V - 1 : rng_int(&r, V));
    loom_cpu_embedding(out, table, ids, T, N);
    for (int64_t t = 0; t < T; t++)
        cr_assert(!memcmp(out + t * N, table + ids[t] * N, sizeof(float) * N), "row %lld",
                  (long long)t);
    free(table), free(out);
}

/* ------------------------------------------------------------- RoPE */

/* Hugging Face's frequency code, transcribed loop by loop in float64. */
static void ref_inv_freq(double *f, int D, double theta, loom_rope_scaling sc, double factor,
                         double lo, double hi, double orig) {
    for (int i = 0; i < D / 2; i++) {
        double inv = 1.0 / pow(theta, (double)(2 * i) / D);
        if (sc == LOOM_ROPE_SCALING_LINEAR) inv = inv / factor;
        if (sc == LOOM_ROPE_SCALING_LLAMA3) {
            double low_wl = orig / lo, high_wl = orig / hi, wl = 2 * M_PI / inv;
            double inv_l = wl > low_wl ? inv / factor : inv;
            double smooth = (orig / wl - lo) / (hi - lo);
            double smoothed = (1 - smooth) * inv_l / factor + smooth * inv_l;
            bool medium = !(wl < high_wl) && !(wl > low_wl);
            inv = medium ? smoothed : inv_l;
        }
        f[i] = inv;
    }
}

Test(kernels, rope_frequencies) {
    double got[64], want[64];
    /* Llama-3.1 8B's settings: every band (kept, smoothed, divided) occurs */
    loom_cpu_rope_inv_freq(got, 128, 500000.0, LOOM_ROPE_SCALING_LLAMA3, 8, 1, 4, 8192);
    ref_inv_freq(want, 128, 500000.0, LOOM_ROPE_SCALING_LLAMA3, 8, 1, 4, 8192);
    int kept = 0, divided = 0, smoothed = 0;
    for (int i = 0; i < 64; i++) {
        cr_assert_float_eq(got[i], want[i], 1e-12 * want[i], "llama3 inv_freq[%d] %g vs %g", i,
                           got[i], want[i]);
        double plain = pow(500000.0, -2.0 * i / 128);
        if (fabs(got[i] - plain) < 1e-15 * plain) kept++;
        else if (fabs(got[i] - plain / 8) < 1e-15 * plain) divided++;
        else smoothed++;
    }
    cr_assert(kept > 0 && divided > 0 && smoothed > 0, "bands kept %d divided %d smoothed %d", kept,
              divided, smoothed);
    loom_cpu_rope_inv_freq(got, 64, 10000.0, LOOM_ROPE_SCALING_LINEAR, 4, 0, 0, 0);
    ref_inv_freq(want, 64, 10000.0, LOOM_ROPE_SCALING_LINEAR, 4, 0, 0, 0);
    for (int i = 0; i < 32; i++) cr_assert_float_eq(got[i], want[i], 1e-12 * want[i]);
    loom_cpu_rope_inv_freq(got, 64, 100000.0, LOOM_ROPE_SCALING_NONE, 0, 0, 0, 0);
    for (int i = 0; i < 32; i++)
        cr_assert_float_eq(got[i], pow(100000.0, -i / 32.0), 1e-12 * got[i]);
}

Test(kernels, rope_apply) {
    test_rng r = rng_seeded("kernels.rope_apply");
    int dims[] = {16, 64, 128};
    loom_rope_scaling scal[] = {LOOM_ROPE_SCALING_NONE, LOOM_ROPE_SCALING_LINEAR,
                                LOOM_ROPE_SCALING_LLAMA3};
    for (int di = 0; di < 3; di++)
        for (int si = 0; si < 3; si++) {
            int D = dims[di], half = D / 2, nh = 1 + (int)rng_int(&r, 5);
            int64_t T = 1 + rng_int(&r, 40), ld = (int64_t)nh * D + 7;
            double inv[64];
            loom_cpu_rope_inv_freq(inv, D, 10000.0, scal[si], 8, 1, 4, 1024);
            double want_inv[64];
            ref_inv_freq(want_inv, D, 10000.0, scal[si], 8, 1, 4, 1024);
            int32_t *pos = xmalloc(sizeof(int32_t) * T);
            for (int64_t t = 0; t < T; t++) pos[t] = (int32_t)(t % 3 == 0 ? rng_int(&r, 200000) : rng_int(&r, 64));
            float *x = xmalloc(sizeof(float) * T * ld), *x0 = xmalloc(sizeof(float) * T * ld);
            float *c = xmalloc(sizeof(float) * T * half), *s = xmalloc(sizeof(float) * T * half);
            rng_fill(&r, x, T * ld, 1);
            memcpy(x0, x, sizeof(float) * T * ld);
            loom_cpu_rope_table(c, s, pos, T, inv, half);
            loom_cpu_rope_apply(x, ld, T, nh, D, c, s);
            double num = 0, den = 1e-30;
            for (int64_t t = 0; t < T; t++) {
                for (int h = 0; h < nh; h++)
                    for (int i = 0; i < half; i++) {
                        double a = (double)pos[t] * want_inv[i];
                        double x1 = x0[t * ld + h * D + i], x2 = x0[t * ld + h * D + i + half];
                        double y1 = x1 * cos(a) - x2 * sin(a), y2 = x2 * cos(a) + x1 * sin(a);
                        num = err_max(num, fabs(x[t * ld + h * D + i] - y1));
                        num = err_max(num, fabs(x[t * ld + h * D + i + half] - y2));
                        den = fmax(den, fmax(fabs(y1), fabs(y2)));
                    }
                for (int64_t j = (int64_t)nh * D; j < ld; j++)
                    cr_assert_eq(x[t * ld + j], x0[t * ld + j], "rope wrote past the heads");
            }
            cr_assert_lt(num / den, F32_TOL, "rope D %d scaling %d rel err %g", D, si, num / den);
            free(pos), free(x), free(x0), free(c), free(s);
        }
}

/* ------------------------------------------------------------- linear */

/* y = x w^T (+ beta y) (+ bias) against float64, element by element:
 * |y - ref| <= 1e-5 * sum |terms| (the float32 dot-product error bound). */
static void check_linear(test_rng *r, int64_t M, int64_t N, int64_t K, int64_t ldx, int64_t ldy,
                         bool bias, float beta, loom_cpu_pool *pool, bool force_small) {
    float *x = xmalloc(sizeof(float) * M * ldx), *w = xmalloc(sizeof(float) * N * K);
    float *y = xmalloc(sizeof(float) * M * ldy), *y0 = xmalloc(sizeof(float) * M * ldy);
    float *bv = xmalloc(sizeof(float) * N);
    rng_fill(r, x, M * ldx, 1);
    rng_fill(r, w, N * K, 1.0 / sqrt((double)K));
    rng_fill(r, bv, N, 1);
    rng_fill(r, y, M * ldy, 1);
    if (beta == 0.0f) y[0] = NAN; /* beta 0 must not read y */
    memcpy(y0, y, sizeof(float) * M * ldy);
    if (force_small) loom_cpu_linear_small_m(y, ldy, x, ldx, w, bias ? bv : NULL, M, N, K, beta, pool);
    else loom_cpu_linear(y, ldy, x, ldx, w, bias ? bv : NULL, M, N, K, beta, pool);
    for (int64_t i = 0; i < M; i++) {
        for (int64_t j = 0; j < N; j++) {
            double ref = 0, mag = 0;
            for (int64_t q = 0; q < K; q++) {
                ref += (double)x[i * ldx + q] * w[j * K + q];
                mag += fabs((double)x[i * ldx + q] * w[j * K + q]);
            }
            if (beta != 0.0f) ref += y0[i * ldy + j], mag += fabs(y0[i * ldy + j]);
            if (bias) ref += bv[j], mag += fabs(bv[j]);
            double e = fabs(y[i * ldy + j] - ref);
            cr_assert(e <= F32_TOL * mag + 1e-30,
                      "linear%s M %lld N %lld K %lld bias %d beta %g: y[%lld,%lld] = %g, ref %g "
                      "(mag %g)",
                      force_small ? "_small_m" : "", (long long)M, (long long)N, (long long)K,
                      bias, beta, (long long)i, (long long)j, y[i * ldy + j], ref, mag);
        }
        if (M > 1)
            for (int64_t j = N; j < ldy; j++)
                cr_assert_eq(y[i * ldy + j], y0[i * ldy + j], "linear wrote past row %lld",
                             (long long)i);
    }
    free(x), free(w), free(y), free(y0), free(bv);
}

Test(kernels, linear) {
    test_rng r = rng_seeded("kernels.linear");
    loom_cpu_blas_threads(2);
    loom_cpu_pool *pool = loom_cpu_pool_create(2);
    /* M = 1 (sgemv), 2..LOOM_CPU_SMALL_M (small-M kernel), beyond (sgemm) */
    int64_t Ms[] = {1, 2, 3, 4, 5, 7, LOOM_CPU_SMALL_M, LOOM_CPU_SMALL_M + 1, 33};
    int64_t Ns[] = {1, 5, 64, 301};
    int64_t Ks[] = {1, 3, 64, 257};
    int n = 0;
    for (int a = 0; a < 9; a++)
        for (int b = 0; b < 4; b++)
            for (int k = 0; k < 4; k++, n++)
                check_linear(&r, Ms[a], Ns[b], Ks[k], Ks[k] + (a % 2) * 3, Ns[b] + (b % 2) * 2,
                             (a + b + k) % 2, (a + k) % 2 ? 1.0f : 0.0f, n % 3 ? pool : NULL,
                             false);
    cr_assert(loom_cpu_blas_core() && *loom_cpu_blas_core());
    loom_cpu_pool_destroy(pool);
}

Test(kernels, linear_small_m_any_shape) {
    test_rng r = rng_seeded("kernels.linear_small_m_any_shape");
    loom_cpu_pool *pool = loom_cpu_pool_create(3);
    for (int i = 0; i < 40; i++) {
        int64_t M = 1 + rng_int(&r, 40), N = 1 + rng_int(&r, 700), K = 1 + rng_int(&r, 600);
        check_linear(&r, M, N, K, K + rng_int(&r, 4), N + rng_int(&r, 4), i % 2, i % 3 ? 0.0f : 1.0f,
                     i % 4 ? pool : NULL, true);
    }
    loom_cpu_pool_destroy(pool);
}

/* ------------------------------------------------------------- float16 */

Test(kernels, f16_conversion) {
    test_rng r = rng_seeded("kernels.f16_conversion");
    /* every code: f16 -> f32 matches the compiler's _Float16, and back */
    int64_t n = 65536 + 5; /* a tail past the vector width */
    uint16_t *h = xmalloc(sizeof(uint16_t) * n), *h2 = xmalloc(sizeof(uint16_t) * n);
    float *f = xmalloc(sizeof(float) * n);
    for (int64_t i = 0; i < n; i++) h[i] = (uint16_t)(i < 65536 ? i : rng_int(&r, 65536));
    loom_cpu_f16_to_f32(f, h, n);
    loom_cpu_f32_to_f16(h2, f, n);
    for (int64_t i = 0; i < n; i++) {
        _Float16 hv;
        memcpy(&hv, &h[i], 2);
        float want = (float)hv;
        if (isnan(want)) {
            cr_assert(isnan(f[i]), "code %04x should be NaN", h[i]);
            continue;
        }
        cr_assert(!memcmp(&f[i], &want, 4), "code %04x: %g vs %g", h[i], f[i], want);
        cr_assert_eq(h2[i], h[i], "round trip of code %04x gave %04x", h[i], h2[i]);
    }
    /* random float32 over the whole range: round to nearest even like the
     * compiler's conversion */
    for (int64_t i = 0; i < n; i++) {
        uint32_t bits = (uint32_t)rng_next(&r);
        if (i % 3 == 0) bits = (bits & 0x807fffffu) | ((uint32_t)(100 + rng_int(&r, 50)) << 23);
        memcpy(&f[i], &bits, 4);
    }
    loom_cpu_f32_to_f16(h2, f, n);
    for (int64_t i = 0; i < n; i++) {
        _Float16 want = (_Float16)f[i];
        uint16_t wb;
        memcpy(&wb, &want, 2);
        if (isnan(f[i])) cr_assert((h2[i] & 0x7c00) == 0x7c00 && (h2[i] & 0x3ff), "NaN lost");
        else cr_assert_eq(h2[i], wb, "f32 %a -> %04x, want %04x", (double)f[i], h2[i], wb);
    }
    free(h), free(h2), free(f);
}

/* ------------------------------------------------------ paged attention */

/* f16 round trip, as the cache stores it. */
static float kt_f16_round(float x) { return (float)(_Float16)x; }

typedef struct attn_case {
    int S;
    const int *ctx;   /* (S) context length after this step */
    const int *qlen;  /* (S) query tokens this step (the last qlen positions) */
    int window;       /* sliding window (0: none)                              */
} attn_case;

/* The first key a query at position p sees under window w. */
static int kt_first_key(int w, int p) { return w > 0 && p + 1 > w ? p + 1 - w : 0; }

/* One batch through kv_write + paged attention vs a float64 softmax over the
 * logical (contiguous) K/V; returns the relative error. */
static bool g_attn_split = true; /* run_attn hands attention its key-chunk scratch */
static double run_attn(test_rng *r, const attn_case *cs, int H, int KVH, int D, int bs, loom_dtype dt,
                       loom_cpu_pool *pool) {
    int S = cs->S, T = 0, max_blocks = 0, total_blocks = 0;
    for (int s = 0; s < S; s++) {
        int nb = (cs->ctx[s] + bs - 1) / bs;
        T += cs->qlen[s];
        total_blocks += nb;
        if (nb > max_blocks) max_blocks = nb;
    }
    int num_blocks = total_blocks + 3, stride = max_blocks + 1;
    /* a shuffled assignment of physical blocks */
    int *perm = xmalloc(sizeof(int) * num_blocks);
    for (int i = 0; i < num_blocks; i++) perm[i] = i;
    for (int i = num_blocks - 1; i > 0; i--) {
        int j = (int)rng_int(r, i + 1), t = perm[i];
        perm[i] = perm[j], perm[j] = t;
    }
    int32_t *bt = xmalloc(sizeof(int32_t) * S * stride);
    for (int i = 0, k = 0; i < S; i++)
        for (int j = 0; j < stride; j++)
            bt[i * stride + j] = j < (cs->ctx[i] + bs - 1) / bs ? perm[k++] : -7;
    size_t esz = dt == LOOM_DTYPE_F16 ? 2 : 4;
    size_t pool_elems = (size_t)num_blocks * KVH * bs * D;
    void *kp = xmalloc(pool_elems * esz), *vp = xmalloc(pool_elems * esz);
    memset(kp, 0xff, pool_elems * esz); /* NaN everywhere: reading an unwritten slot shows */
    memset(vp, 0xff, pool_elems * esz);
    loom_cpu_kv kv = {.k = kp, .v = vp, .dtype = dt, .num_blocks = num_blocks, .num_kv_heads = KVH,
                      .block_size = bs, .head_dim = D};

    /* logical K/V per sequence: (ctx, KVH, D) */
    float **K = xmalloc(sizeof(float *) * S), **Vv = xmalloc(sizeof(float *) * S);
    int ld_kv = KVH * D + 5; /* strided rows, as in the fused qkv buffer */
    for (int s = 0; s < S; s++) {
        K[s] = xmalloc(sizeof(float) * cs->ctx[s] * ld_kv);
        Vv[s] = xmalloc(sizeof(float) * cs->ctx[s] * ld_kv);
        rng_fill(r, K[s], (int64_t)cs->ctx[s] * ld_kv, 1);
        rng_fill(r, Vv[s], (int64_t)cs->ctx[s] * ld_kv, 1);
        /* earlier steps: positions before this step's queries */
        int prior = cs->ctx[s] - cs->qlen[s];
        int64_t *slots = xmalloc(sizeof(int64_t) * (prior + 1));
        for (int p = 0; p < prior; p++)
            slots[p] = (int64_t)bt[s * stride + p / bs] * bs + p % bs;
        loom_cpu_kv_write(&kv, K[s], ld_kv, Vv[s], ld_kv, slots, prior);
        /* the cache keeps everything, but what no query of this step may
         * see under the window goes back to NaN: a read of it shows */
        int unseen = kt_first_key(cs->window, prior);
        for (int p = 0; p < unseen && p < prior; p++)
            for (int h = 0; h < KVH; h++) {
                size_t e = (((size_t)bt[s * stride + p / bs] * KVH + h) * bs + p % bs) * D;
                memset((char *)kp + e * esz, 0xff, D * esz);
                memset((char *)vp + e * esz, 0xff, D * esz);
            }
        free(slots);
    }
    /* this step's batch */
    int ldq = H * D + 3, ldo = H * D + 4;
    float *q = xmalloc(sizeof(float) * T * ldq), *out = xmalloc(sizeof(float) * T * ldo);
    float *knew = xmalloc(sizeof(float) * T * ld_kv), *vnew = xmalloc(sizeof(float) * T * ld_kv);
    int32_t *qs = xmalloc(sizeof(int32_t) * (S + 1)), *pos = xmalloc(sizeof(int32_t) * T);
    int64_t *slot = xmalloc(sizeof(int64_t) * T);
    rng_fill(r, q, (int64_t)T * ldq, 1);
    for (int i = 0; i < T * ldo; i++) out[i] = 777.f;
    qs[0] = 0;
    for (int s = 0, t = 0; s < S; s++) {
        for (int j = 0; j < cs->qlen[s]; j++, t++) {
            int p = cs->ctx[s] - cs->qlen[s] + j;
            pos[t] = p;
            slot[t] = (int64_t)bt[s * stride + p / bs] * bs + p % bs;
            memcpy(knew + (int64_t)t * ld_kv, K[s] + (int64_t)p * ld_kv, sizeof(float) * ld_kv);
            memcpy(vnew + (int64_t)t * ld_kv, Vv[s] + (int64_t)p * ld_kv, sizeof(float) * ld_kv);
        }
        qs[s + 1] = qs[s] + cs->qlen[s];
    }
    loom_cpu_kv_write(&kv, knew, ld_kv, vnew, ld_kv, slot, T);
    float scale = 1.0f / sqrtf((float)D);
    loom_cpu_attn_args a = {.out = out, .ldo = ldo, .q = q, .ldq = ldq, .kv = &kv, .num_heads = H,
                            .num_tokens = T, .num_seqs = S, .query_start = qs, .positions = pos,
                            .block_table = bt, .block_table_stride = stride, .scale = scale,
                            .window = cs->window};
    /* with g_attn_split, the scratch that lets a call split keys over the pool */
    if (g_attn_split) {
        a.part_floats = loom_cpu_attention_part_floats(&a);
        a.part = xmalloc(sizeof(float) * (size_t)(a.part_floats > 0 ? a.part_floats : 1));
    }
    loom_cpu_paged_attention(&a, pool);
    free(a.part);

    /* float64 reference over the logical K/V (rounded like the cache) */
    double num = 0, den = 1e-30;
    int g = H / KVH;
    double *sc = xmalloc(sizeof(double) * 4096), acc[256];
    for (int s = 0; s < S; s++)
        for (int t = qs[s]; t < qs[s + 1]; t++)
            for (int h = 0; h < H; h++) {
                int kvh = h / g, p = pos[t], lo = kt_first_key(cs->window, p);
                double mx = -INFINITY, sum = 0;
                for (int j = lo; j <= p; j++) {
                    double d = 0;
                    for (int e = 0; e < D; e++) {
                        float kk = K[s][(int64_t)j * ld_kv + kvh * D + e];
                        if (dt == LOOM_DTYPE_F16) kk = kt_f16_round(kk);
                        d += (double)q[(int64_t)t * ldq + h * D + e] * kk;
                    }
                    sc[j] = d * scale;
                    mx = fmax(mx, sc[j]);
                }
                for (int e = 0; e < D; e++) acc[e] = 0;
                for (int j = lo; j <= p; j++) {
                    double pj = exp(sc[j] - mx);
                    sum += pj;
                    for (int e = 0; e < D; e++) {
                        float vv = Vv[s][(int64_t)j * ld_kv + kvh * D + e];
                        if (dt == LOOM_DTYPE_F16) vv = kt_f16_round(vv);
                        acc[e] += pj * vv;
                    }
                }
                for (int e = 0; e < D; e++) {
                    double ref = acc[e] / sum;
                    double got = out[(int64_t)t * ldo + h * D + e];
                    double d = fabs(got - ref);
                    num = fmax(num, d != d ? INFINITY : d);
                    den = fmax(den, fabs(ref));
                }
                for (int e = H * D; e < ldo; e++)
                    cr_assert_eq(out[(int64_t)t * ldo + e], 777.f, "attention wrote past heads");
            }
    for (int s = 0; s < S; s++) free(K[s]), free(Vv[s]);
    free(K), free(Vv), free(perm), free(bt), free(kp), free(vp), free(q), free(out), free(knew);
    free(vnew), free(qs), free(pos), free(slot), free(sc);
    return num / den;
}

Test(kernels, paged_attention_shapes) {
    test_rng r = rng_seeded("kernels.paged_attention_shapes");
    loom_cpu_pool *pool = loom_cpu_pool_create(3);
    /* ragged around block boundaries: full prefill, decode, mid-prompt chunk */
    static const int ctx_a[] = {1, 15, 16, 17, 33}, q_a[] = {1, 15, 16, 1, 10};
    static const int ctx_b[] = {64, 100, 5}, q_b[] = {1, 37, 5};
    static const int ctx_c[] = {48}, q_c[] = {1};
    attn_case cases[] = {{5, ctx_a, q_a}, {3, ctx_b, q_b}, {1, ctx_c, q_c}};
    int heads[][2] = {{4, 4}, {6, 2}, {8, 2}, {8, 1}}; /* GQA ratio 1, 3, 4, 8 */
    int dims[] = {64, 128, 36}; /* 36: the kernels' tails past multiples of 16 and 8 */
    loom_dtype dts[] = {LOOM_DTYPE_F32, LOOM_DTYPE_F16};
    int n = 0;
    for (int ci = 0; ci < 3; ci++)
        for (int hi = 0; hi < 4; hi++)
            for (int di = 0; di < 3; di++)
                for (int ti = 0; ti < 2; ti++, n++) {
                    int bs = n % 5 == 4 ? 5 : 16; /* mostly 16; sometimes an odd size */
                    double e = run_attn(&r, &cases[ci], heads[hi][0], heads[hi][1], dims[di], bs,
                                        dts[ti], n % 2 ? pool : NULL);
                    cr_assert_lt(e, F32_TOL,
                                 "attention case %d H %d KVH %d D %d bs %d %s: rel err %g", ci,
                                 heads[hi][0], heads[hi][1], dims[di], bs,
                                 loom_dtype_name(dts[ti]), e);
                }
    loom_cpu_pool_destroy(pool);
}

Test(kernels, paged_attention_block_sizes) {
    test_rng r = rng_seeded("kernels.paged_attention_block_sizes");
    static const int ctx[] = {1, 2, 31, 32, 33, 70}, ql[] = {1, 2, 3, 32, 1, 9};
    attn_case c = {6, ctx, ql};
    int sizes[] = {1, 2, 8, 16, 32, 64};
    for (int i = 0; i < 6; i++) {
        double e = run_attn(&r, &c, 4, 2, 64, sizes[i], LOOM_DTYPE_F32, NULL);
        cr_assert_lt(e, F32_TOL, "block size %d: rel err %g", sizes[i], e);
    }
}

Test(kernels, paged_attention_threaded_long) {
    /* big enough to take the pool path: long decode and a long prefill
     * (keys over several 512-position chunks); decode batches of long
     * contexts, whose keys split over the threads (and once more without
     * the scratch for it: the heads spread instead), windows among them */
    test_rng r = rng_seeded("kernels.paged_attention_threaded_long");
    loom_cpu_pool *pool = loom_cpu_pool_create(2);
    static const int ctx[] = {1500, 300, 7}, ql[] = {1, 300, 7};
    attn_case c = {3, ctx, ql};
    double e = run_attn(&r, &c, 8, 2, 64, 16, LOOM_DTYPE_F32, pool);
    cr_assert_lt(e, F32_TOL, "long threaded attention rel err %g", e);
    e = run_attn(&r, &c, 9, 3, 64, 16, LOOM_DTYPE_F16, pool);
    cr_assert_lt(e, F32_TOL, "long threaded attention (f16) rel err %g", e);
    static const int dctx[] = {2100, 513, 1030}, dql[] = {1, 1, 1};
    for (int split = 1; split >= 0; split--) {
        g_attn_split = split;
        for (int w = 0; w < 2; w++) {
            attn_case d = {3, dctx, dql, w ? 700 : 0};
            e = run_attn(&r, &d, 9, 3, 64, 16, LOOM_DTYPE_F16, pool);
            cr_assert_lt(e, F32_TOL, "long decode batch (split %d, window %d) rel err %g", split, d.window, e);
            d.S = 1;
            e = run_attn(&r, &d, 8, 2, 128, 16, LOOM_DTYPE_F32, pool);
            cr_assert_lt(e, F32_TOL, "long decode (split %d, window %d) rel err %g", split, d.window, e);
        }
    }
    g_attn_split = true;
    loom_cpu_pool_destroy(pool);
}

/* Sliding window (Gemma 3's local layers): each query sees only the last
 * `window` positions; slots before the window hold NaN (run_attn). Decode,
 * prefill chunks and whole prompts, windows shorter than a block, across
 * block edges and longer than the context. */
Test(kernels, paged_attention_sliding_window) {
    test_rng r = rng_seeded("kernels.paged_attention_sliding_window");
    loom_cpu_pool *pool = loom_cpu_pool_create(2);
    static const int ctx[] = {600, 70, 9, 40}, ql[] = {1, 30, 9, 40};
    const int windows[] = {1, 7, 16, 33, 512, 1000};
    const int sizes[] = {16, 5};
    for (int wi = 0; wi < 6; wi++)
        for (int bi = 0; bi < 2; bi++) {
            attn_case c = {4, ctx, ql, windows[wi]};
            double e = run_attn(&r, &c, 4, 1, 64, sizes[bi], wi % 2 ? LOOM_DTYPE_F16 : LOOM_DTYPE_F32,
                                bi ? pool : NULL);
            cr_assert_lt(e, F32_TOL, "window %d block size %d: rel err %g", windows[wi], sizes[bi], e);
        }
    loom_cpu_pool_destroy(pool);
}

/* A query's output does not depend on the tokens that share its call: the
 * last 7 positions of a sequence attended together (one work item covers
 * 4 of them) give, bit for bit, what each gives alone (a decode step vs a
 * verify step of speculative decoding), with and without a window (which
 * starts the run's first tile elsewhere than a lone query's), blocks
 * shorter and longer than the kernel's 32-key tile, with and without the
 * pool, f32 and f16 caches; at 1100 positions (three key chunks) the lone
 * queries with the pool split their keys over the threads (windows 0 and
 * 900: the others leave too little work for the pool). */
Test(kernels, paged_attention_is_batch_invariant) {
    test_rng r = rng_seeded("kernels.paged_attention_invariant");
    loom_cpu_pool *pool = loom_cpu_pool_create(2);
    enum { H = 6, KVH = 2, D = 64, Q = 7 };
    /* 900 at 1100 positions: a window starting inside a chunk, split; 48:
     * blocks that do not divide 512 (480-position chunks) */
    const int windows[] = {0, 5, 40, 130, 600, 900}, sizes[] = {16, 64, 48}, ctxs[] = {150, 1100};
    int n = 0;
    for (int xi = 0; xi < 2; xi++)
    for (int wi = 0; wi < 6; wi++)
        for (int bi = 0; bi < 3; bi++)
            for (int di = 0; di < 2; di++, n++) {
                const int CTX = ctxs[xi];
                const int BS = sizes[bi], NB = (CTX + BS - 1) / BS;
                const loom_dtype dt = di ? LOOM_DTYPE_F16 : LOOM_DTYPE_F32;
                const size_t esz = di ? 2 : 4, elems = (size_t)NB * KVH * BS * D;
                void *kp = xmalloc(elems * esz), *vp = xmalloc(elems * esz);
                loom_cpu_kv kv = {.k = kp, .v = vp, .dtype = dt, .num_blocks = NB, .num_kv_heads = KVH,
                                  .block_size = BS, .head_dim = D};
                float *k = xmalloc(sizeof(float) * CTX * KVH * D), *v = xmalloc(sizeof(float) * CTX * KVH * D);
                int64_t *slot = xmalloc(sizeof(int64_t) * CTX);
                int32_t *bt = xmalloc(sizeof(int32_t) * NB);
                for (int b = 0; b < NB; b++) bt[b] = NB - 1 - b; /* blocks in reverse */
                for (int p = 0; p < CTX; p++) slot[p] = (int64_t)bt[p / BS] * BS + p % BS;
                rng_fill(&r, k, CTX * KVH * D, 2);
                rng_fill(&r, v, CTX * KVH * D, 1);
                loom_cpu_kv_write(&kv, k, KVH * D, v, KVH * D, slot, CTX);
                float *q = xmalloc(sizeof(float) * Q * H * D), *all = xmalloc(sizeof(float) * Q * H * D);
                float *one = xmalloc(sizeof(float) * H * D);
                rng_fill(&r, q, Q * H * D, 1);
                int32_t pos[Q], qs[2] = {0, Q};
                for (int t = 0; t < Q; t++) pos[t] = CTX - Q + t;
                loom_cpu_attn_args a = {.out = all, .ldo = H * D, .q = q, .ldq = H * D, .kv = &kv,
                                        .num_heads = H, .num_tokens = Q, .num_seqs = 1, .query_start = qs,
                                        .positions = pos, .block_table = bt, .block_table_stride = NB,
                                        .scale = 0.125f, .window = windows[wi]};
                loom_cpu_paged_attention(&a, n % 2 ? pool : NULL);
                float part[H * 4 * (D + 2)]; /* 1100 positions: three key chunks */
                for (int t = 0; t < Q; t++) {
                    int32_t qs1[2] = {0, 1};
                    loom_cpu_attn_args a1 = a;
                    a1.out = one, a1.q = q + t * H * D, a1.num_tokens = 1, a1.query_start = qs1;
                    a1.positions = &pos[t], a1.part = part, a1.part_floats = H * 4 * (D + 2);
                    cr_assert_leq(loom_cpu_attention_part_floats(&a1), a1.part_floats);
                    loom_cpu_paged_attention(&a1, n % 2 ? NULL : pool);
                    cr_assert(!memcmp(one, all + t * H * D, sizeof(float) * H * D),
                              "context %d window %d block size %d %s: token %d alone differs from the same "
                              "token among %d",
                              CTX, windows[wi], BS, loom_dtype_name(dt), t, Q);
                }
                free(kp), free(vp), free(k), free(v), free(slot), free(bt), free(q), free(all), free(one);
            }
    loom_cpu_pool_destroy(pool);
}

Test(kernels, kv_write_skips_negative_slots) {
    float k[2 * 8], v[2 * 8];
    for (int i = 0; i < 16; i++) k[i] = (float)i, v[i] = (float)-i;
    float kp[2 * 1 * 2 * 8], vp[2 * 1 * 2 * 8]; /* 2 blocks, 1 head, bs 2, D 8 */
    for (int i = 0; i < 32; i++) kp[i] = vp[i] = 5.f;
    loom_cpu_kv kv = {.k = kp, .v = vp, .dtype = LOOM_DTYPE_F32, .num_blocks = 2,
                      .num_kv_heads = 1, .block_size = 2, .head_dim = 8};
    int64_t slots[2] = {-1, 3};
    loom_cpu_kv_write(&kv, k, 8, v, 8, slots, 2);
    for (int i = 0; i < 24; i++) {
        cr_assert_eq(kp[i], 5.f);
        cr_assert_eq(vp[i], 5.f);
    }
    for (int i = 0; i < 8; i++) {
        cr_assert_eq(kp[24 + i], k[8 + i]);
        cr_assert_eq(vp[24 + i], v[8 + i]);
    }
}

/* An f16 cache saturates what it cannot hold: |x| > 65504 is stored as
 * +-65504 (an inf value would make a head's output inf or NaN for every
 * later query, 0 * inf where a probability underflows), NaN stays NaN, and
 * attention over the saturated rows stays finite: one query, a key row of
 * 1e6 (its score dominates) and a value row of -1e6 give -65504 there. */
Test(kernels, kv_write_f16_saturates) {
    enum { D = 20, BS = 4 }; /* D = 20: the 8-lane loop and its tail */
    float k[3 * D], v[3 * D];
    for (int i = 0; i < 3 * D; i++) k[i] = 0.f, v[i] = (float)(i % 7) - 3.f;
    for (int i = 0; i < D; i++) k[D + i] = 1e6f, v[D + i] = -1e6f;
    v[2 * D + 3] = NAN;
    uint16_t kp[BS * D], vp[BS * D];
    loom_cpu_kv kv = {.k = kp, .v = vp, .dtype = LOOM_DTYPE_F16, .num_blocks = 1, .num_kv_heads = 1,
                      .block_size = BS, .head_dim = D};
    int64_t slots[3] = {0, 1, 2};
    loom_cpu_kv_write(&kv, k, D, v, D, slots, 3);
    float kb[BS * D], vb[BS * D];
    loom_cpu_f16_to_f32(kb, kp, 3 * D);
    loom_cpu_f16_to_f32(vb, vp, 3 * D);
    for (int i = 0; i < D; i++) {
        cr_assert_eq(kb[D + i], 65504.f, "key %d stored as %g", i, (double)kb[D + i]);
        cr_assert_eq(vb[D + i], -65504.f, "value %d stored as %g", i, (double)vb[D + i]);
        cr_assert_eq(vb[i], v[i]);
    }
    cr_assert(isnan(vb[2 * D + 3]), "NaN stored as %g", (double)vb[2 * D + 3]);
    /* attention at position 1 (keys 0 and 1): the saturated key's score wins outright */
    float q[D], out[D];
    for (int i = 0; i < D; i++) q[i] = 1.f;
    int32_t pos[1] = {1}, qs[2] = {0, 1}, bt[1] = {0};
    loom_cpu_attn_args a = {.out = out, .ldo = D, .q = q, .ldq = D, .kv = &kv, .num_heads = 1,
                            .num_tokens = 1, .num_seqs = 1, .query_start = qs, .positions = pos,
                            .block_table = bt, .block_table_stride = 1, .scale = 0.125f};
    loom_cpu_paged_attention(&a, NULL);
    for (int i = 0; i < D; i++) cr_assert_eq(out[i], -65504.f, "output %d: %g", i, (double)out[i]);
}

/* The host's rule (core/plugin/host_rules.c, one pass, float64 exps):
 * the reference loom_cpu_logits_topk must reproduce in ids and values. */
static void ref_topk(const float *row, int64_t V, const uint32_t *allowed, int k, int32_t *ids, float *vals,
                     double *lse) {
    int n = 0;
    float mx = -INFINITY;
    for (int64_t v = 0; v < V; v++) {
        float x = row[v];
        if (x != x) x = -INFINITY;
        if (x > mx) mx = x;
        if (allowed && !((allowed[v >> 5] >> (v & 31)) & 1u)) x = -INFINITY;
        if (n == k && !(x > vals[k - 1])) continue;
        int j = n < k ? n++ : k - 1;
        while (j > 0 && x > vals[j - 1]) vals[j] = vals[j - 1], ids[j] = ids[j - 1], j--;
        vals[j] = x, ids[j] = (int32_t)v;
    }
    for (; n < k; n++) ids[n] = -1, vals[n] = -INFINITY;
    if (!(mx > -INFINITY) || mx == INFINITY) {
        *lse = mx;
        return;
    }
    double z = 0;
    for (int64_t v = 0; v < V; v++)
        if (row[v] == row[v]) z += exp((double)row[v] - mx);
    *lse = mx + log(z);
}

/* loom_cpu_logits_topk against the host's rule: the same ids and values
 * (ties by ascending id across its chunks, NaN and masked ids as -inf,
 * padding past the vocabulary), the log-sum-exp within 1e-6 relative, and
 * the same bits at 1, 2 and 3 threads; vocabularies from 1 to past 64
 * chunks of 8192, ties, NaN, +-inf, sparse and dense masks. */
Test(kernels, logits_topk_matches_the_host_rule) {
    test_rng r = rng_seeded("kernels.logits_topk");
    loom_cpu_pool *pools[3] = {NULL, loom_cpu_pool_create(2), loom_cpu_pool_create(3)};
    const int64_t vocabs[] = {1, 7, 100, 8191, 8197, 49152, 262144, 600011};
    for (int it = 0; it < 48; it++) {
        const int64_t V = vocabs[it % 8];
        const int ks[] = {1, 5, 64, 10};
        const int k = ks[(it / 8) % 4];
        float *row = xmalloc(sizeof(float) * V);
        uint32_t *allowed = xmalloc(sizeof(uint32_t) * (V / 32 + 1));
        const int kind = it % 6; /* 0 plain, 1 ties, 2 NaN / -inf, 3 +inf, 4 sparse mask, 5 dense mask */
        for (int64_t v = 0; v < V; v++) {
            double x = 3.0 * rng_normal(&r);
            row[v] = (float)(kind == 1 ? floor(x * 2) / 2 : x);
        }
        if (kind == 2)
            for (int64_t v = 0; v < V; v += 1 + rng_int(&r, 50)) row[v] = rng_int(&r, 2) ? NAN : -INFINITY;
        if (kind == 3) row[rng_int(&r, V)] = INFINITY;
        for (int64_t w = 0; w <= V / 32; w++)
            allowed[w] = kind == 4 ? 0u : (uint32_t)rng_int(&r, 1ll << 32);
        if (kind == 4)
            for (int j = 0; j < 3; j++) {
                const int64_t v = rng_int(&r, V);
                allowed[v >> 5] |= 1u << (v & 31);
            }
        const uint32_t *mask = kind >= 4 ? allowed : NULL;
        int32_t rid[64], gid[3][64];
        float rv[64], gv[3][64], glse[3];
        double rlse;
        ref_topk(row, V, mask, k, rid, rv, &rlse);
        for (int p = 0; p < 3; p++) {
            loom_cpu_logits_topk(row, V, mask, k, gid[p], gv[p], &glse[p], pools[p]);
            for (int j = 0; j < k; j++)
                cr_assert(gid[p][j] == rid[j] && (gv[p][j] == rv[j] || (gv[p][j] != gv[p][j] && rv[j] != rv[j])),
                          "vocab %lld k %d kind %d threads %d: entry %d is id %d %g, host id %d %g", (long long)V, k,
                          kind, p + 1, j, gid[p][j], (double)gv[p][j], rid[j], (double)rv[j]);
            if (isinf(rlse)) cr_assert_eq(glse[p], (float)rlse);
            else
                cr_assert_leq(fabs(glse[p] - rlse), 1e-6 * fmax(1.0, fabs(rlse)),
                              "vocab %lld kind %d: lse %.9g, host %.9g", (long long)V, kind, (double)glse[p], rlse);
            cr_assert(!memcmp(&glse[p], &glse[0], sizeof(float)) && !memcmp(gid[p], gid[0], sizeof(int32_t) * k),
                      "vocab %lld: %d threads differ from one", (long long)V, p + 1);
        }
        free(row), free(allowed);
    }
    /* every entry NaN: no max, lse -inf, the first k ids at -inf */
    float nan_row[5] = {NAN, NAN, NAN, NAN, NAN}, v3[3], lse = 0;
    int32_t i3[3];
    loom_cpu_logits_topk(nan_row, 5, NULL, 3, i3, v3, &lse, pools[1]);
    cr_assert(lse == -INFINITY && i3[0] == 0 && i3[1] == 1 && i3[2] == 2 && v3[2] == -INFINITY);
    for (int p = 1; p < 3; p++) loom_cpu_pool_destroy(pools[p]);
}
