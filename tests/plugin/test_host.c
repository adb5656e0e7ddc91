/*
 * tests/plugin/test_host.c — the default host table: metrics (add, set,
 * lookup, ordered iteration, reset, threads), thread count, allocation,
 * error formatting, conversions between element types, logging.
 */
#include <criterion/criterion.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>
#include <math.h>
#include <stddef.h>
#include <stdlib.h>

#include "../common/fmt_ref.h"
#include "plugin/host.h"

Test(plugin_host, table_fields) {
    const loom_host *h = loom_host_default();
    cr_assert_eq(h->struct_size, sizeof(loom_host));
    cr_assert_eq(h->abi_major, LOOM_ABI_MAJOR);
    cr_assert_eq(h->abi_minor, LOOM_ABI_MINOR);
    /* every member after ctx is a function, and none is NULL (plugin.h) */
    const size_t first = offsetof(loom_host, log);
    for (size_t off = first; off + sizeof(void (*)(void)) <= sizeof *h; off += sizeof(void (*)(void))) {
        void (*fn)(void);
        memcpy(&fn, (const char *)h + off, sizeof fn);
        cr_assert(fn, "host table member at offset %zu is NULL", off);
    }
    cr_assert_eq(loom_host_default(), h, "one static table");
}

Test(plugin_host, metrics_add_set_get) {
    const loom_host *h = loom_host_default();
    loom_metrics_reset();
    cr_assert_eq(loom_metrics_get("a.count"), 0.0);
    cr_assert_not(loom_metrics_lookup("a.count", NULL));
    h->metric_add(h->ctx, "a.count", 2);
    h->metric_add(h->ctx, "a.count", 3);
    h->metric_set(h->ctx, "b.gauge", 7.5);
    h->metric_set(h->ctx, "b.gauge", 1.25);
    h->metric_add(h->ctx, NULL, 1); /* ignored, no crash */
    h->metric_add(h->ctx, "", 1);
    double v = 0;
    cr_assert(loom_metrics_lookup("a.count", &v));
    cr_assert_eq(v, 5.0);
    cr_assert_eq(loom_metrics_get("b.gauge"), 1.25);
    cr_assert_eq(loom_metrics_count(), 2);
    loom_metrics_reset();
    cr_assert_eq(loom_metrics_count(), 0);
}

typedef struct seen {
    int n;
    char names[8][32];
} seen;

static void collect(void *user, const char *name, double value) {
    seen *s = user;
    (void)value;
    if (s->n < 8) snprintf(s->names[s->n++], sizeof s->names[0], "%s", name);
    /* Callbacks may touch metrics: the snapshot is taken outside the lock. */
    loom_metrics_get(name);
}

Test(plugin_host, metrics_foreach_sorted) {
    const loom_host *h = loom_host_default();
    loom_metrics_reset();
    h->metric_add(h->ctx, "sched.steps", 1);
    h->metric_add(h->ctx, "cache.evictions", 1);
    h->metric_add(h->ctx, "engine.tokens", 1);
    seen s = {0};
    loom_metrics_foreach(collect, &s);
    cr_assert_eq(s.n, 3);
    cr_assert_str_eq(s.names[0], "cache.evictions");
    cr_assert_str_eq(s.names[1], "engine.tokens");
    cr_assert_str_eq(s.names[2], "sched.steps");
}

static void *hammer(void *arg) {
    const loom_host *h = arg;
    char name[32];
    for (int i = 0; i < 2000; i++) {
        snprintf(name, sizeof name, "m.%d", i % 17);
        h->metric_add(h->ctx, name, 1);
        h->metric_add(h->ctx, "m.total", 1);
    }
    return NULL;
}

Test(plugin_host, metrics_thread_safe) {
    const loom_host *h = loom_host_default();
    loom_metrics_reset();
    pthread_t t[4];
    for (int i = 0; i < 4; i++) pthread_create(&t[i], NULL, hammer, (void *)h);
    for (int i = 0; i < 4; i++) pthread_join(t[i], NULL);
    cr_assert_eq(loom_metrics_get("m.total"), 8000.0);
    cr_assert_eq(loom_metrics_count(), 18);
}

Test(plugin_host, threads) {
    const loom_host *h = loom_host_default();
    long cores = sysconf(_SC_NPROCESSORS_ONLN);
    loom_host_set_threads(0);
    cr_assert_eq(h->num_threads(h->ctx), (int32_t)(cores > 0 ? cores : 1));
    loom_host_set_threads(3);
    cr_assert_eq(h->num_threads(h->ctx), 3);
    cr_assert_eq(loom_host_threads(), 3);
    loom_host_set_threads(-5);
    cr_assert_eq(h->num_threads(h->ctx), (int32_t)(cores > 0 ? cores : 1));
}

Test(plugin_host, alloc_and_error) {
    const loom_host *h = loom_host_default();
    void *p = h->alloc(h->ctx, 0);
    cr_assert_not_null(p, "size 0 still gives a pointer");
    h->free(h->ctx, p);
    int *z = h->calloc(h->ctx, 4, sizeof(int));
    cr_assert_not_null(z);
    cr_assert_eq(z[0] + z[1] + z[2] + z[3], 0);
    h->free(h->ctx, z);
    h->free(h->ctx, NULL);

    loom_error err = {0};
    cr_assert_eq(h->error(h->ctx, &err, LOOM_ERR_NO_SPACE, "need %d blocks", 3), LOOM_ERR_NO_SPACE);
    cr_assert_eq(err.code, LOOM_ERR_NO_SPACE);
    cr_assert_str_eq(err.message, "need 3 blocks");
    cr_assert_eq(h->error(h->ctx, NULL, LOOM_ERR_IO, "x"), LOOM_ERR_IO, "NULL err is fine");
    h->log(h->ctx, LOOM_LOG_DEBUG, "test", "debug line %d (filtered by default)", 1);
}

Test(plugin_host, convert) {
    const loom_host *h = loom_host_default();
    float src[4] = {1, -2, 3.5f, 0}, dst[4] = {0};
    cr_assert_eq(h->convert(LOOM_DTYPE_F32, dst, LOOM_DTYPE_F32, src, 4), LOOM_OK);
    cr_assert_eq(memcmp(src, dst, sizeof src), 0);
    uint16_t half[2] = {0x3c00, 0xc000}; /* 1.0, -2.0 */
    cr_assert_eq(h->convert(LOOM_DTYPE_F32, dst, LOOM_DTYPE_F16, half, 2), LOOM_OK);
    cr_assert_eq(dst[0], 1.0f);
    cr_assert_eq(dst[1], -2.0f);
    uint16_t back[2];
    cr_assert_eq(h->convert(LOOM_DTYPE_F16, back, LOOM_DTYPE_F32, dst, 2), LOOM_OK);
    cr_assert(back[0] == 0x3c00 && back[1] == 0xc000);
    cr_assert_eq(h->convert(LOOM_DTYPE_BF16, back, LOOM_DTYPE_F32, dst, 2), LOOM_OK);
    cr_assert(back[0] == 0x3f80 && back[1] == 0xc000, "bf16 is the top half of f32");
    cr_assert_eq(h->convert(LOOM_DTYPE_F16, back, LOOM_DTYPE_BF16, half, 2), LOOM_ERR_UNSUPPORTED);
    cr_assert_neq(h->convert(LOOM_DTYPE_F32, dst, LOOM_DTYPE_Q4_1, src, 5), LOOM_OK, "partial block refused");
    cr_assert_eq(h->convert(LOOM_DTYPE_F32, dst, LOOM_DTYPE_F32, src, -1), LOOM_ERR_INVALID);
}

/* E4M3 against its definition, computed in double (tests/common/fmt_ref.h):
 * every code decodes to its value, and encoding is round to nearest even of
 * the decoded grid, saturating at 448. */
Test(plugin_host, convert_e4m3) {
    const loom_host *h = loom_host_default();
    for (int c = 0; c < 256; c++) {
        uint8_t code = (uint8_t)c;
        float f;
        cr_assert_eq(h->convert(LOOM_DTYPE_F32, &f, LOOM_DTYPE_FP8_E4M3, &code, 1), LOOM_OK);
        if ((c & 0x7f) == 0x7f) {
            cr_assert(isnan(f), "code 0x%02x is NaN", c);
            continue;
        }
        cr_assert_eq((double)f, fr_e4m3_value(c), "code 0x%02x decodes to %g", c, (double)f);
        uint8_t again;
        cr_assert_eq(h->convert(LOOM_DTYPE_FP8_E4M3, &again, LOOM_DTYPE_F32, &f, 1), LOOM_OK);
        cr_assert_eq(again, code, "0x%02x round-trips (got 0x%02x)", c, again);
    }
    /* fresh random values: the nearest code, ties to even mantissa */
    srand(12345);
    for (int i = 0; i < 20000; i++) {
        float x = (float)ldexp((double)rand() / RAND_MAX * 2 - 1, rand() % 22 - 12);
        uint8_t q;
        cr_assert_eq(h->convert(LOOM_DTYPE_FP8_E4M3, &q, LOOM_DTYPE_F32, &x, 1), LOOM_OK);
        double best = INFINITY;
        for (int c = 0; c < 256; c++) {
            if ((c & 0x7f) == 0x7f) continue;
            double d = fabs(fr_e4m3_value(c) - (double)x);
            if (d < best) best = d;
        }
        double got = fabs(x) >= 448 ? fabs(fr_e4m3_value(q)) - 448 : fabs(fr_e4m3_value(q) - (double)x);
        cr_assert(got <= best, "%.9g encodes to 0x%02x (%g), not a nearest code", (double)x, q, fr_e4m3_value(q));
    }
}
