/*
 * bench/cpu_decode.c — speed of the cpu backend on a real model: batch-1
 * decode and a 128-token prefill, next to the memory-bandwidth roofline
 * measured in the same run.
 *
 *   cpu_decode [model.gguf] [threads]      (defaults: $LOOM_TEST_MODEL, all cores)
 *
 * Roofline: a batch-1 decode step must stream every weight it uses once —
 * all linear layers plus the LM head, in float32 as this backend holds them —
 * so tokens/s <= copy bandwidth / weight bytes per token. Bandwidth is
 * memcpy over 512 MiB buffers (far past the caches), counted as bytes read +
 * bytes written (PERF.md's convention), best of single- and all-thread
 * copies, best of 5. Timings are medians after warm-up, on real (greedy)
 * tokens. Not a test: prints a table, exits 0 unless something failed.
 */
#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "fake_host.h"
#include "model/model.h"
#include "tb_util.h"

#ifndef LOOM_CPU_BACKEND_DEFAULT
#define LOOM_CPU_BACKEND_DEFAULT "loom-backend-cpu.so"
#endif

static double now_s(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static double median(double *v, int n) {
    qsort(v, (size_t)n, sizeof *v, cmp_double);
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

/* ------------------------------------------------------------- bandwidth */

typedef struct copy_job {
    char *dst;
    const char *src;
    size_t n;
} copy_job;

static void *copy_main(void *arg) {
    copy_job *j = arg;
    memcpy(j->dst, j->src, j->n);
    return NULL;
}

/* Best read+write bytes/s of memcpy over `bytes` with `threads` threads. */
static double copy_bw(char *dst, const char *src, size_t bytes, int threads) {
    double best = 0;
    pthread_t th[64];
    copy_job jobs[64];
    if (threads > 64) threads = 64;
    for (int rep = 0; rep < 5; rep++) {
        size_t slice = bytes / (size_t)threads;
        double t0 = now_s();
        for (int i = 0; i < threads; i++) {
            jobs[i] = (copy_job){dst + (size_t)i * slice, src + (size_t)i * slice, slice};
            if (i > 0) pthread_create(&th[i], NULL, copy_main, &jobs[i]);
        }
        copy_main(&jobs[0]);
        for (int i = 1; i < threads; i++) pthread_join(th[i], NULL);
        double dt = now_s() - t0;
        double bw = 2.0 * (double)(slice * (size_t)threads) / dt;
        if (bw > best) best = bw;
    }
    return best;
}

/* OpenBLAS's kernel set, asked of the copy the plugin loaded (RTLD_NOLOAD:
 * the bench links no BLAS itself). */
static const char *loom_cpu_blas_core_name(void) {
    static const char *const libs[] = {"libopenblas.so.0", "libopenblas.so", "libblas.so.3"};
    for (size_t i = 0; i < sizeof libs / sizeof *libs; i++) {
        void *h = dlopen(libs[i], RTLD_NOW | RTLD_NOLOAD);
        if (!h) continue;
        const char *(*fn)(void) = (const char *(*)(void))dlsym(h, "openblas_get_corename");
        const char *name = fn ? fn() : NULL;
        dlclose(h);
        if (name) return name;
    }
    return "unknown";
}

/* ------------------------------------------------------------- main */

static int argmax(const float *x, int n) {
    int a = 0;
    for (int i = 1; i < n; i++)
        if (x[i] > x[a]) a = i;
    return a;
}

int main(int argc, char **argv) {
    const char *path = argc > 1 ? argv[1] : getenv("LOOM_TEST_MODEL");
    int threads = argc > 2 ? atoi(argv[2]) : (int)sysconf(_SC_NPROCESSORS_ONLN);
    if (!path) {
        fprintf(stderr, "usage: cpu_decode model.gguf [threads]  (or set LOOM_TEST_MODEL)\n");
        return 2;
    }
    if (!getenv("LOOM_CPU_BACKEND_SO")) setenv("LOOM_CPU_BACKEND_SO", LOOM_CPU_BACKEND_DEFAULT, 1);

    /* copy buffers (measured right before the decode, see below) */
    size_t bw_bytes = (size_t)512 << 20;
    char *a = malloc(bw_bytes), *b2 = malloc(bw_bytes);
    if (!a || !b2) return fprintf(stderr, "out of memory for the bandwidth buffers\n"), 1;
    memset(a, 1, bw_bytes);
    memset(b2, 2, bw_bytes);

    loom_error err = {0};
    loom_model *model = NULL;
    loom_model_load_opts o = {.path = path};
    if (loom_model_load(&o, &model, &err) != LOOM_OK)
        return fprintf(stderr, "load %s: %s\n", path, err.message), 1;
    const loom_model_view *view = loom_model_view_get(model);
    const loom_model_config *c = view->config;

    tb b;
    memset(&b, 0, sizeof b);
    char msg[512];
    if (!tb_load_plugin(&b, msg, sizeof msg)) return fprintf(stderr, "%s\n", msg), 1;
    tb_config cfg = {.threads = threads};
    double t_load = now_s();
    if (b.ops->create(fake_host(), &cfg, &b.self, &err) ||
        b.ops->load(b.self, view, NULL, &err))
        return fprintf(stderr, "backend: %s\n", err.message), 1;
    t_load = now_s() - t_load;
    int bs = 16, nblocks = 64;
    loom_kv_layout lay = {.struct_size = sizeof lay, .block_size = bs, .num_blocks = nblocks,
                          .dtype = LOOM_DTYPE_F32};
    if (b.ops->kv_alloc(b.self, &lay, &err) || !tb_blocks_init(&b, bs, nblocks, 0))
        return fprintf(stderr, "kv: %s\n", err.message), 1;
    loom_backend_memory mem = {0};
    b.ops->memory(b.self, &mem, &err);

    /* bytes a decode step streams: every layer's linear weights and norms,
     * the final norm and the LM head, float32 */
    double H = c->hidden_size, I = c->intermediate_size, V = c->vocab_size;
    double QD = (double)c->num_heads * c->head_dim, KVD = (double)c->num_kv_heads * c->head_dim;
    double per_layer = (QD + 2 * KVD) * H + H * QD + 2 * I * H + H * I + 2 * H;
    double tok_bytes = 4.0 * (c->num_layers * per_layer + V * H + H);

    int V_ = c->vocab_size;
    float *lg = malloc(sizeof(float) * (size_t)V_ * 2);
    int32_t *tok = malloc(sizeof(int32_t) * 1024);
    for (int i = 0; i < 1024; i++) tok[i] = (int32_t)(1 + (i * 7919) % (V_ - 1));

    /* prefill 128 tokens: fresh sequence each time; 1 warm-up + 5 timed */
    double pre[5];
    for (int rep = 0; rep < 6; rep++) {
        tb_seq s = {.tokens = tok, .len = 128};
        tb_seq *ss[1] = {&s};
        int32_t n = 128;
        tb_batch tbb;
        tb_build(&b, ss, &n, 1, false, &tbb);
        double t0 = now_s();
        if (b.ops->forward(b.self, &tbb.batch, lg, &err))
            return fprintf(stderr, "forward: %s\n", err.message), 1;
        double dt = now_s() - t0;
        if (rep > 0) pre[rep - 1] = dt;
        tb_batch_free(&tbb);
        tb_seq_release(&b, &s);
    }
    double t_pre = median(pre, 5);

    /* the roofline's bandwidth, measured next to the decode it bounds (the
     * machine may be shared: compare numbers from one run only) */
    double bw1 = copy_bw(b2, a, bw_bytes, 1), bwn = copy_bw(b2, a, bw_bytes, threads);
    double bw = bw1 > bwn ? bw1 : bwn;
    double roof = bw / tok_bytes;
    free(a);
    free(b2);

    /* decode: prompt of 32 tokens, then 128 greedy steps; first 8 are warm-up */
    enum { PROMPT = 32, STEPS = 136, WARM = 8 };
    double dec[STEPS];
    tb_seq s = {.tokens = tok, .len = PROMPT};
    tb_seq *ss[1] = {&s};
    int32_t n = PROMPT;
    tb_batch tbb;
    tb_build(&b, ss, &n, 1, false, &tbb);
    b.ops->forward(b.self, &tbb.batch, lg, &err);
    tb_batch_free(&tbb);
    s.done = PROMPT;
    for (int i = 0; i < STEPS; i++) {
        tok[s.done] = argmax(lg, V_);
        s.len = s.done + 1;
        n = 1;
        tb_build(&b, ss, &n, 1, false, &tbb);
        double t0 = now_s();
        if (b.ops->forward(b.self, &tbb.batch, lg, &err))
            return fprintf(stderr, "forward: %s\n", err.message), 1;
        dec[i] = now_s() - t0;
        tb_batch_free(&tbb);
        s.done++;
    }
    double mean = 0;
    for (int i = WARM; i < STEPS; i++) mean += dec[i];
    mean /= STEPS - WARM;
    double t_dec = median(dec + WARM, STEPS - WARM);

    tb_seq_release(&b, &s);

    /* decode at batch 8: 8 sequences of 32-token prompts, 40 steps, 8 warm-up */
    enum { NB = 8, BSTEPS = 40 };
    tb_seq bseq[NB];
    tb_seq *bss[NB];
    int32_t bn[NB];
    int32_t *btok = malloc(sizeof(int32_t) * NB * 128);
    for (int i = 0; i < NB * 128; i++) btok[i] = (int32_t)(1 + (i * 104729) % (V_ - 1));
    for (int i = 0; i < NB; i++) {
        bseq[i] = (tb_seq){.tokens = btok + i * 128, .len = 128};
        bss[i] = &bseq[i];
        bn[i] = PROMPT;
    }
    float *blg = malloc(sizeof(float) * (size_t)V_ * NB);
    tb_build(&b, bss, bn, NB, false, &tbb);
    b.ops->forward(b.self, &tbb.batch, blg, &err);
    tb_batch_free(&tbb);
    for (int i = 0; i < NB; i++) bseq[i].done = PROMPT, bn[i] = 1;
    double bdec[BSTEPS];
    for (int st = 0; st < BSTEPS; st++) {
        tb_build(&b, bss, bn, NB, false, &tbb);
        double t0 = now_s();
        if (b.ops->forward(b.self, &tbb.batch, blg, &err))
            return fprintf(stderr, "forward: %s\n", err.message), 1;
        bdec[st] = now_s() - t0;
        tb_batch_free(&tbb);
        for (int i = 0; i < NB; i++) bseq[i].done++;
    }
    double t_bdec = median(bdec + 8, BSTEPS - 8);
    free(btok);
    free(blg);

    char loadavg[64] = "?";
    FILE *la = fopen("/proc/loadavg", "r");
    if (la) {
        if (!fgets(loadavg, sizeof loadavg, la)) strcpy(loadavg, "?");
        loadavg[strcspn(loadavg, "\n")] = 0;
        fclose(la);
    }
    printf("model            %s (%s)\n", c->name, path);
    printf("load average     %s (other work on the machine skews every figure)\n", loadavg);
    printf("threads          %d (OpenBLAS core %s%s)\n", threads, loom_cpu_blas_core_name(),
           getenv("OPENBLAS_CORETYPE") ? ", forced by OPENBLAS_CORETYPE" : "");
    printf("load (f32)       %.2f s, weights %.1f MiB\n", t_load, mem.weight_bytes / 1048576.0);
    printf("copy bandwidth   %.1f GB/s read+write (1 thread %.1f, %d threads %.1f)\n", bw / 1e9,
           bw1 / 1e9, threads, bwn / 1e9);
    printf("bytes / token    %.1f MB (f32 linear weights + LM head)\n", tok_bytes / 1e6);
    printf("roofline         %.1f tok/s (batch-1 decode)\n", roof);
    printf("decode batch 1   %.1f tok/s median (%.2f ms/token; mean %.2f ms), %.0f%% of roofline, "
           "%.1f GB/s of weights\n",
           1.0 / t_dec, t_dec * 1e3, mean * 1e3, 100.0 / t_dec / roof, tok_bytes / t_dec / 1e9);
    printf("decode batch 8   %.1f tok/s median (%.2f ms/step)\n", NB / t_bdec, t_bdec * 1e3);
    printf("prefill 128      %.1f tok/s (%.1f ms, %.0f GFLOP/s in the linear layers)\n",
           128.0 / t_pre, t_pre * 1e3, 128.0 * 2.0 * tok_bytes / 4.0 / t_pre / 1e9);

    free(lg);
    free(tok);
    tb_close(&b);
    loom_model_free(model);
    return 0;
}
