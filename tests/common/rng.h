/*
 * tests/common/rng.h — seeded random numbers for the CPU kernel and
 * backend tests. Each test draws a fresh seed from the clock (or
 * LOOM_TEST_SEED to replay a failure) and prints it, so a failing run can be
 * reproduced exactly. Header-only; xoshiro-style splitmix64 stream.
 */
#ifndef LOOM_TEST_RNG_H
#define LOOM_TEST_RNG_H

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>

typedef struct test_rng {
    uint64_t s;
} test_rng;

static inline uint64_t rng_next(test_rng *r) {
    uint64_t z = (r->s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

/* Uniform in [0, 1). */
static inline double rng_unif(test_rng *r) { return (double)(rng_next(r) >> 11) * 0x1p-53; }
/* Uniform in [lo, hi). */
static inline double rng_range(test_rng *r, double lo, double hi) { return lo + (hi - lo) * rng_unif(r); }
/* Integer in [0, n). */
static inline int64_t rng_int(test_rng *r, int64_t n) { return (int64_t)(rng_next(r) % (uint64_t)n); }
/* Standard normal (Box-Muller). */
static inline double rng_normal(test_rng *r) {
    double u = rng_unif(r), v = rng_unif(r);
    if (u < 1e-300) u = 1e-300;
    return sqrt(-2.0 * log(u)) * cos(2.0 * M_PI * v);
}

/* A fresh seed for test `name` (clock, pid, name), or LOOM_TEST_SEED; printed. */
static inline test_rng rng_seeded(const char *name) {
    uint64_t seed;
    const char *env = getenv("LOOM_TEST_SEED");
    if (env) {
        seed = strtoull(env, NULL, 0);
    } else {
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        seed = (uint64_t)ts.tv_sec * 1000000007ull ^ (uint64_t)ts.tv_nsec ^ ((uint64_t)getpid() << 32);
        for (const char *p = name; *p; p++) seed = seed * 131 + (unsigned char)*p;
    }
    fprintf(stderr, "[%s] seed %llu (replay with LOOM_TEST_SEED=%llu)\n", name,
            (unsigned long long)seed, (unsigned long long)seed);
    test_rng r = {seed};
    return r;
}

static inline void rng_fill(test_rng *r, float *x, int64_t n, double scale) {
    for (int64_t i = 0; i < n; i++) x[i] = (float)(rng_normal(r) * scale);
}

#endif
