/*
 * bench/gpu/pd_onegpu.c — prefill/decode disaggregation inside one process
 * against one colocated engine, under Poisson arrivals (docs/disaggregation.md,
 * "One GPU"). Links libloom only: the engines come from pipeline files, so
 * the same program runs on the cpu backend (tests/disagg) and on a GPU
 * where the two engines sit on complementary SM partitions
 * (backend.sm_count / backend.sm_partition, CUDA green contexts).
 *
 *   pd_onegpu CONFIG --mode colo|disagg|check|scale [--set K=V]... [--cset K=V]...
 *             [--pset K=V]... [--dset K=V]... [--rates R,R,...] [--num N]
 *             [--in-lo A --in-hi B] [--out-lo A --out-hi B] [--vocab-hi V]
 *             [--seed S] [--ttft-ms T --tpot-ms P] [--json PATH]
 *
 * colo: one engine (CONFIG + --set + --cset). disagg: a prefill engine
 * (CONFIG + --set + --pset) runs each prompt as a one-token request; its
 * on_kv_export reads all but the last prompt token's KV blocks out (the
 * backend's kv_read_blocks) and hands them straight to a decode engine
 * (CONFIG + --set + --dset) through loom_engine_kv_deliver — the in-process
 * connector: no socket, no shared-memory segment, one host buffer. The
 * decode engine computes the last prompt token and samples every output
 * token. Each engine is stepped by its own thread.
 *
 * Per rate: --num requests, prompts of uniform [in-lo, in-hi] random ids
 * below vocab-hi, uniform [out-lo, out-hi] output tokens (ignore_eos),
 * exponential inter-arrival times (rate inf: all at once); the same
 * workload (seeded) in both modes. Reported: TTFT (arrival to first token)
 * and TPOT ((last - first) / (outputs - 1)) p50 / p90 / p99, throughput,
 * and goodput: requests meeting TTFT <= ttft-ms and TPOT <= tpot-ms per
 * second of the run (arrival of the first to the end of the last).
 *
 * check: the same greedy workload (all at once) through both modes; exits
 * 1 unless every request's tokens are identical.
 *
 * scale: one engine (as colo) and two fixed phases, all at once: 8 prompts
 * of in-hi tokens with one output (prefill), then num prompts of in-lo
 * tokens with out-hi outputs (decode); the step lines say what its SMs buy
 * (run it with backend.sm_count in --cset).
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "loom/engine.h"

#ifdef PD_CUDA_HOST
#include <cuda_runtime_api.h>
#endif
#include <malloc.h>

#define MAX_SETS 64
#define MAX_RATES 16

typedef struct req {
    int32_t *prompt;
    int32_t n_in, n_out;
    double arrival;   /* seconds after the run's start */
    double t_first, t_last;
    int32_t got;
    int32_t *out;     /* (n_out) generated tokens */
    _Atomic int done; /* 1 ok, 2 error */
    char error[256];
    int64_t decode_id;
    double kv_seconds; /* disagg: the export callback (read out + hand over) */
    _Atomic int kv_done; /* disagg: kv_seconds written (the hand-over thread) */
    size_t kv_bytes;
} req;

typedef struct runner {
    loom_engine *e;
    _Atomic int stop;
    _Atomic int want_stats; /* set by main, cleared by the stepping thread with snap filled */
    loom_engine_stats snap;
    pthread_t th;
    _Atomic int failed; /* set after why is written (its stepping thread) */
    char why[LOOM_ERROR_MSG_MAX];
} runner;

static struct timespec t0;
static double now_s(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)(t.tv_sec - t0.tv_sec) + 1e-9 * (double)(t.tv_nsec - t0.tv_nsec);
}

static void *step_loop(void *arg) {
    runner *r = arg;
    loom_error err = {0};
    while (!atomic_load(&r->stop)) {
        int32_t active = 0;
        if (loom_engine_step(r->e, &active, &err) != LOOM_OK) {
            snprintf(r->why, sizeof r->why, "%s", err.message);
            atomic_store(&r->failed, 1);
            break;
        }
        if (atomic_load(&r->want_stats)) {
            loom_engine_get_stats(r->e, &r->snap, sizeof r->snap); /* [engine]: on its own thread */
            atomic_store(&r->want_stats, 0);
        }
        if (active == 0) usleep(100);
    }
    return NULL;
}

static void on_token(void *user, const loom_token_event *ev) {
    req *q = user;
    double t = now_s();
    if (ev->token >= 0 && q->got < q->n_out) {
        if (q->got == 0) q->t_first = t;
        q->t_last = t;
        q->out[q->got++] = ev->token;
    }
    if (ev->finish != LOOM_FINISH_NONE) {
        if (ev->finish == LOOM_FINISH_ERROR || ev->finish == LOOM_FINISH_ABORT) {
            snprintf(q->error, sizeof q->error, "%s", ev->error ? ev->error : "aborted");
            atomic_store(&q->done, 2);
        } else {
            atomic_store(&q->done, 1);
        }
    }
}

/* disagg: the prefill side. The export callback (prefill engine thread)
 * reads the blocks into one of NBUF host buffers — pinned when built with
 * CUDA, so the device-to-host copy is one DMA — and queues it; a hand-over
 * thread gives it to the decode engine (loom_engine_kv_deliver copies it)
 * and frees the buffer, so the prefill engine waits for the read only. */
typedef struct pf_ctx {
    req *q;
    loom_engine *decode;
} pf_ctx;

#define NBUF 4
typedef struct kv_job {
    int buf;
    pf_ctx *c;
    loom_kv_handoff h;
    double t0;
} kv_job;

static struct {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    void *buf[NBUF];
    size_t cap[NBUF];
    bool busy[NBUF];
    kv_job q[NBUF];
    int head, count;
    bool stop;
    pthread_t th;
} hand = {.mu = PTHREAD_MUTEX_INITIALIZER, .cv = PTHREAD_COND_INITIALIZER};

static int g_in_hi; /* the longest prompt of the run */

static void *host_alloc(size_t n) {
#ifdef PD_CUDA_HOST
    void *p = NULL;
    if (cudaHostAlloc(&p, n, cudaHostAllocDefault) == cudaSuccess) return p;
#endif
    void *m = malloc(n);
    if (m) memset(m, 0, n); /* fault the pages in once */
    return m;
}

static void host_free(void *p) {
    if (!p) return;
#ifdef PD_CUDA_HOST
    if (cudaFreeHost(p) == cudaSuccess) return;
#endif
    free(p);
}

static void *hand_loop(void *arg) {
    (void)arg;
    pthread_mutex_lock(&hand.mu);
    for (;;) {
        while (!hand.count && !hand.stop) pthread_cond_wait(&hand.cv, &hand.mu);
        if (!hand.count) break;
        kv_job j = hand.q[hand.head];
        hand.head = (hand.head + 1) % NBUF;
        hand.count--;
        pthread_mutex_unlock(&hand.mu);
        loom_error err = {0};
        if (loom_engine_kv_deliver(j.c->decode, j.c->q->decode_id, &j.h, &err) != LOOM_OK)
            loom_engine_kv_fail(j.c->decode, j.c->q->decode_id, err.message);
        j.c->q->kv_seconds = now_s() - j.t0;
        atomic_store(&j.c->q->kv_done, 1);
        pthread_mutex_lock(&hand.mu);
        hand.busy[j.buf] = false;
        pthread_cond_broadcast(&hand.cv);
    }
    pthread_mutex_unlock(&hand.mu);
    return NULL;
}

static loom_status pf_export(void *user, const loom_kv_export *x) {
    pf_ctx *c = user;
    req *q = c->q;
    double t = now_s();
    int32_t n = x->num_tokens - 1, nb = (n + x->block_size - 1) / x->block_size;
    size_t len = (size_t)nb * x->block_bytes;
    loom_error err = {0};
    pthread_mutex_lock(&hand.mu);
    int b = -1;
    while (b < 0) {
        for (int i = 0; i < NBUF && b < 0; i++)
            if (!hand.busy[i]) b = i;
        if (b < 0) pthread_cond_wait(&hand.cv, &hand.mu);
    }
    hand.busy[b] = true;
    pthread_mutex_unlock(&hand.mu);
    if (len > hand.cap[b]) {
        /* all buffers at once, sized for the longest prompt: pinning is slow,
         * do it during the warm-up rather than mid-run */
        size_t most = (size_t)((g_in_hi - 1 + x->block_size - 1) / x->block_size) * x->block_bytes;
        if (most < len) most = len;
        pthread_mutex_lock(&hand.mu);
        for (int i = 0; i < NBUF; i++)
            if (i == b || (!hand.busy[i] && hand.cap[i] < most)) {
                host_free(hand.buf[i]);
                hand.cap[i] = 0;
                if ((hand.buf[i] = host_alloc(most))) hand.cap[i] = most;
            }
        pthread_mutex_unlock(&hand.mu);
    }
    loom_status st = hand.buf[b] ? x->read(x->ctx, 0, nb, hand.buf[b], len, &err) : LOOM_ERR_NOMEM;
    pthread_mutex_lock(&hand.mu);
    if (st == LOOM_OK) {
        hand.q[(hand.head + hand.count) % NBUF] =
            (kv_job){.buf = b, .c = c, .t0 = t,
                     .h = {.struct_size = sizeof(loom_kv_handoff), .num_tokens = n, .tokens = q->prompt,
                           .block_size = x->block_size, .num_blocks = nb, .block_bytes = x->block_bytes,
                           .blocks = hand.buf[b]}};
        hand.count++;
    } else {
        hand.busy[b] = false;
    }
    pthread_cond_broadcast(&hand.cv);
    pthread_mutex_unlock(&hand.mu);
    if (st != LOOM_OK) loom_engine_kv_fail(c->decode, q->decode_id, hand.buf[b] ? err.message : "out of host memory");
    q->kv_bytes = len;
    return st;
}

static void pf_event(void *user, const loom_token_event *ev) {
    pf_ctx *c = user;
    if (ev->finish == LOOM_FINISH_ERROR || ev->finish == LOOM_FINISH_ABORT)
        loom_engine_kv_fail(c->decode, c->q->decode_id, ev->error ? ev->error : "the prefill was aborted");
}

/* ------------------------------------------------------------- options */

typedef struct opts {
    const char *config, *mode, *json;
    const char *set[MAX_SETS], *cset[MAX_SETS], *pset[MAX_SETS], *dset[MAX_SETS];
    int nset, ncset, npset, ndset;
    double rates[MAX_RATES];
    int nrates;
    int num, in_lo, in_hi, out_lo, out_hi, vocab_hi;
    unsigned seed;
    double ttft_ms, tpot_ms;
} opts;

static int usage(void) {
    fprintf(stderr, "usage: pd_onegpu CONFIG --mode colo|disagg|check|scale [--set K=V] [--cset K=V] [--pset K=V] "
                    "[--dset K=V] [--rates R,...|inf] [--num N] [--in-lo A] [--in-hi B] [--out-lo A] [--out-hi B] "
                    "[--vocab-hi V] [--seed S] [--ttft-ms T] [--tpot-ms P] [--json PATH]\n");
    return 2;
}

static int parse_int(const char *s, int lo, int *out) {
    char *end;
    long v = strtol(s, &end, 10);
    if (*s == 0 || *end || v < lo || v > 1 << 24) return -1;
    *out = (int)v;
    return 0;
}

static int parse_args(int argc, char **argv, opts *o) {
    *o = (opts){.mode = "colo", .num = 32, .in_lo = 1024, .in_hi = 4096, .out_lo = 64, .out_hi = 256,
                .vocab_hi = 32000, .seed = 1, .ttft_ms = 1000, .tpot_ms = 30};
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        int bad = 0;
#define NEXT (i++, v) /* v checked above */
        if (a[0] != '-') {
            if (o->config) return fprintf(stderr, "pd_onegpu: two configs (%s, %s)\n", o->config, a), -1;
            o->config = a;
            continue;
        }
        if (!v) return fprintf(stderr, "pd_onegpu: %s needs a value\n", a), -1;
        if (!strcmp(a, "--mode")) o->mode = NEXT;
        else if (!strcmp(a, "--json")) o->json = NEXT;
        else if (!strcmp(a, "--set") && o->nset < MAX_SETS) o->set[o->nset++] = NEXT;
        else if (!strcmp(a, "--cset") && o->ncset < MAX_SETS) o->cset[o->ncset++] = NEXT;
        else if (!strcmp(a, "--pset") && o->npset < MAX_SETS) o->pset[o->npset++] = NEXT;
        else if (!strcmp(a, "--dset") && o->ndset < MAX_SETS) o->dset[o->ndset++] = NEXT;
        else if (!strcmp(a, "--num")) bad = parse_int(NEXT, 1, &o->num);
        else if (!strcmp(a, "--in-lo")) bad = parse_int(NEXT, 2, &o->in_lo);
        else if (!strcmp(a, "--in-hi")) bad = parse_int(NEXT, 2, &o->in_hi);
        else if (!strcmp(a, "--out-lo")) bad = parse_int(NEXT, 1, &o->out_lo);
        else if (!strcmp(a, "--out-hi")) bad = parse_int(NEXT, 1, &o->out_hi);
        else if (!strcmp(a, "--vocab-hi")) bad = parse_int(NEXT, 2, &o->vocab_hi);
        else if (!strcmp(a, "--seed")) {
            int s;
            bad = parse_int(NEXT, 0, &s);
            o->seed = (unsigned)s;
        } else if (!strcmp(a, "--ttft-ms")) o->ttft_ms = atof(NEXT);
        else if (!strcmp(a, "--tpot-ms")) o->tpot_ms = atof(NEXT);
        else if (!strcmp(a, "--rates")) {
            char *s = strdup(NEXT), *save = NULL;
            for (char *t = strtok_r(s, ",", &save); t; t = strtok_r(NULL, ",", &save)) {
                double r = !strcmp(t, "inf") ? INFINITY : atof(t);
                if (o->nrates >= MAX_RATES || !(r > 0)) bad = -1;
                else o->rates[o->nrates++] = r;
            }
            free(s);
        } else return fprintf(stderr, "pd_onegpu: unknown option %s\n", a), -1;
#undef NEXT
        if (bad) return fprintf(stderr, "pd_onegpu: bad value for %s: %s\n", a, v), -1;
    }
    if (!o->config) return fprintf(stderr, "pd_onegpu: no pipeline file\n"), -1;
    if (strcmp(o->mode, "colo") && strcmp(o->mode, "disagg") && strcmp(o->mode, "check") && strcmp(o->mode, "scale"))
        return fprintf(stderr, "pd_onegpu: --mode is colo, disagg, check or scale, not %s\n", o->mode), -1;
    if (o->in_lo > o->in_hi || o->out_lo > o->out_hi)
        return fprintf(stderr, "pd_onegpu: --in-lo/--in-hi and --out-lo/--out-hi must be ordered ranges\n"), -1;
    if (o->nrates == 0) o->rates[o->nrates++] = INFINITY;
    return 0;
}

static loom_engine *make_engine(const opts *o, const char *const *extra, int nextra, const char *who) {
    const char *ov[2 * MAX_SETS];
    int n = 0;
    for (int i = 0; i < o->nset; i++) ov[n++] = o->set[i];
    for (int i = 0; i < nextra; i++) ov[n++] = extra[i];
    loom_engine *e = NULL;
    loom_error err = {0};
    if (loom_engine_create(o->config, ov, n, &e, &err) != LOOM_OK) {
        fprintf(stderr, "pd_onegpu: the %s engine: %s\n", who, err.message);
        return NULL;
    }
    return e;
}

/* ------------------------------------------------------------ workload */

static double urand(unsigned *s) { return (rand_r(s) + 0.5) / ((double)RAND_MAX + 1.0); }

static req *make_workload(const opts *o, double rate, unsigned seed) {
    req *w = calloc((size_t)o->num, sizeof *w);
    if (!w) return NULL;
    unsigned s = seed;
    double t = 0;
    for (int i = 0; i < o->num; i++) {
        req *q = &w[i];
        q->n_in = o->in_lo + (int)(urand(&s) * (o->in_hi - o->in_lo + 1));
        if (q->n_in > o->in_hi) q->n_in = o->in_hi;
        q->n_out = o->out_lo + (int)(urand(&s) * (o->out_hi - o->out_lo + 1));
        if (q->n_out > o->out_hi) q->n_out = o->out_hi;
        q->prompt = malloc((size_t)q->n_in * sizeof(int32_t));
        q->out = calloc((size_t)q->n_out, sizeof(int32_t));
        if (!q->prompt || !q->out) return NULL;
        for (int j = 0; j < q->n_in; j++) q->prompt[j] = 1 + (int32_t)(urand(&s) * (o->vocab_hi - 2));
        if (isfinite(rate) && i > 0) t += -log(urand(&s)) / rate;
        q->arrival = t;
    }
    return w;
}

static void free_workload(req *w, int n) {
    if (!w) return;
    for (int i = 0; i < n; i++) free(w[i].prompt), free(w[i].out);
    free(w);
}

/* Submit w's requests at their arrival times and wait for all of them.
 * decode == NULL: colocated on e. Returns the seconds of the run. */
static int run_workload(const opts *o, req *w, loom_engine *e, loom_engine *decode, runner *r1, runner *r2,
                        pf_ctx *ctx, double *seconds) {
    clock_gettime(CLOCK_MONOTONIC, &t0);
    for (int i = 0; i < o->num; i++) {
        req *q = &w[i];
        double wait = q->arrival - now_s();
        if (wait > 0) usleep((useconds_t)(wait * 1e6));
        q->arrival = now_s(); /* the submission time is what TTFT counts from */
        loom_request rq = loom_request_default();
        rq.tokens = q->prompt;
        rq.num_tokens = q->n_in;
        rq.ignore_eos = true;
        loom_error err = {0};
        if (!decode) {
            rq.max_tokens = q->n_out;
            rq.on_token = on_token;
            rq.user = q;
            if (loom_engine_add_request(e, &rq, &err) < 0)
                return fprintf(stderr, "pd_onegpu: request %d refused: %s\n", i, err.message), -1;
            continue;
        }
        rq.max_tokens = q->n_out;
        rq.on_token = on_token;
        rq.user = q;
        rq.kv_remote = true;
        if ((q->decode_id = loom_engine_add_request(decode, &rq, &err)) < 0)
            return fprintf(stderr, "pd_onegpu: request %d refused by the decode engine: %s\n", i, err.message), -1;
        ctx[i] = (pf_ctx){.q = q, .decode = decode};
        loom_request pr = loom_request_default();
        pr.tokens = q->prompt;
        pr.num_tokens = q->n_in;
        pr.max_tokens = 1;
        pr.on_token = pf_event;
        pr.on_kv_export = pf_export;
        pr.user = &ctx[i];
        if (loom_engine_add_request(e, &pr, &err) < 0)
            return fprintf(stderr, "pd_onegpu: request %d refused by the prefill engine: %s\n", i, err.message), -1;
    }
    for (;;) {
        int left = 0;
        /* disaggregated: also until the hand-over thread has timed each request */
        for (int i = 0; i < o->num; i++)
            left += atomic_load(&w[i].done) == 0 || (r2 && atomic_load(&w[i].done) == 1 && !atomic_load(&w[i].kv_done));
        if (!left) break;
        if (atomic_load(&r1->failed) || (r2 && atomic_load(&r2->failed)))
            return fprintf(stderr, "pd_onegpu: an engine failed: %s\n", atomic_load(&r1->failed) ? r1->why : r2->why), -1;
        usleep(1000);
    }
    double end = 0;
    for (int i = 0; i < o->num; i++) end = w[i].t_last > end ? w[i].t_last : end;
    *seconds = end - w[0].arrival;
    for (int i = 0; i < o->num; i++)
        if (atomic_load(&w[i].done) == 2)
            return fprintf(stderr, "pd_onegpu: request %d failed: %s\n", i, w[i].error), -1;
    return 0;
}

/* ------------------------------------------------------------- results */

static int cmp_d(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static double pct(double *v, int n, double p) {
    if (n == 0) return NAN;
    qsort(v, (size_t)n, sizeof *v, cmp_d);
    double k = p / 100.0 * (n - 1);
    int i = (int)k;
    return i + 1 < n ? v[i] + (k - i) * (v[i + 1] - v[i]) : v[n - 1];
}

static void report(const opts *o, FILE *js, const char *mode, double rate, req *w, double seconds, bool first) {
    int n = o->num, good = 0;
    double *ttft = malloc(sizeof(double) * (size_t)n), *tpot = malloc(sizeof(double) * (size_t)n);
    double kv = 0;
    size_t kvb = 0;
    long outs = 0;
    /* the rate the arrivals realised (a Poisson sample of n is not the rate) */
    double arrived = n > 1 && w[n - 1].arrival > w[0].arrival ? (n - 1) / (w[n - 1].arrival - w[0].arrival) : INFINITY;
    for (int i = 0; i < n; i++) {
        ttft[i] = 1e3 * (w[i].t_first - w[i].arrival);
        tpot[i] = w[i].got > 1 ? 1e3 * (w[i].t_last - w[i].t_first) / (w[i].got - 1) : 0;
        good += ttft[i] <= o->ttft_ms && tpot[i] <= o->tpot_ms;
        kv += w[i].kv_seconds;
        kvb += w[i].kv_bytes;
        outs += w[i].got;
    }
    if (js) {
        fprintf(js, "%s{\"mode\": \"%s\", \"rate\": %s%.3f, \"requests\": %d, \"seconds\": %.4f, \"good\": %d, "
                    "\"goodput\": %.4f, \"req_per_s\": %.4f, \"output_tok_per_s\": %.1f, \"kv_ms_mean\": %.3f, "
                    "\"kv_mb_mean\": %.2f, \"arrived_per_s\": %.4f, \"ttft_ms\": [", first ? "" : ",\n", mode,
                isfinite(rate) ? "" : "\"inf\", \"rate_value\": ", isfinite(rate) ? rate : 0.0, n, seconds, good,
                good / seconds, n / seconds, outs / seconds, 1e3 * kv / n, (double)kvb / n / 1e6,
                isfinite(arrived) ? arrived : 0.0);
        for (int i = 0; i < n; i++) fprintf(js, "%s%.3f", i ? ", " : "", ttft[i]);
        fprintf(js, "], \"tpot_ms\": [");
        for (int i = 0; i < n; i++) fprintf(js, "%s%.3f", i ? ", " : "", tpot[i]);
        fprintf(js, "]}");
        fflush(js); /* a run cut short keeps the rates it finished */
    }
    double t50 = pct(ttft, n, 50), t90 = pct(ttft, n, 90), t99 = pct(ttft, n, 99);
    double p50 = pct(tpot, n, 50), p90 = pct(tpot, n, 90), p99 = pct(tpot, n, 99);
    if (isfinite(rate)) printf("%-6s rate %6.2f (arrivals %.2f/s): ", mode, rate, arrived);
    else printf("%-6s all at once: ", mode);
    printf("%d requests in %.2f s (%.2f req/s, %.0f out tok/s); TTFT p50/p90/p99 %.0f/%.0f/%.0f ms; "
           "TPOT p50/p90/p99 %.1f/%.1f/%.1f ms; goodput %.2f req/s (%d of %d within TTFT %.0f ms, TPOT %.0f ms)",
           n, seconds, n / seconds, outs / seconds, t50, t90, t99, p50, p90,
           p99, good / seconds, good, n, o->ttft_ms, o->tpot_ms);
    if (kvb) printf("; KV hand-over %.1f ms / %.1f MB a request", 1e3 * kv / n, (double)kvb / n / 1e6);
    printf("\n");
    fflush(stdout);
    free(ttft);
    free(tpot);
}

/* The engine's counters, read by its stepping thread. */
static void snapshot(runner *r, loom_engine_stats *out) {
    atomic_store(&r->want_stats, 1);
    while (atomic_load(&r->want_stats) && !atomic_load(&r->failed)) usleep(100);
    *out = r->snap;
}

/* Steps of each kind an engine ran during one rate (after - before): how
 * many, their mean time, and the tokens they computed per step. */
static void print_steps(const char *who, const loom_engine_stats *a, const loom_engine_stats *b) {
    static const char *const kind[LOOM_STEP_KINDS] = {"prefill", "mixed", "decode"};
    printf("    %s engine:", who);
    for (int k = 0; k < LOOM_STEP_KINDS; k++) {
        int64_t n = b->kind_steps[k] - a->kind_steps[k];
        if (n <= 0) continue;
        printf(" %s %lld steps of %.2f ms, %.0f tokens;", kind[k], (long long)n,
               1e3 * (b->kind_seconds[k] - a->kind_seconds[k]) / (double)n,
               (double)(b->kind_tokens[k] - a->kind_tokens[k]) / (double)n);
    }
    printf(" peak KV blocks %d of %d\n", b->kv_blocks_peak, b->kv_blocks_total);
}

/* One mode over every rate; w_out (check) keeps the last workload. */
static int run_mode(const opts *o, const char *mode, FILE *js, bool *first, req **w_out) {
    bool dis = !strcmp(mode, "disagg");
    runner r1 = {0}, r2 = {0};
    loom_engine *e = make_engine(o, dis ? o->pset : o->cset, dis ? o->npset : o->ncset, dis ? "prefill" : "colocated");
    loom_engine *d = dis ? make_engine(o, o->dset, o->ndset, "decode") : NULL;
    int rc = 0;
    if (!e || (dis && !d)) rc = 1;
    loom_error err = {0};
    loom_kv_info pi = {.struct_size = sizeof pi}, di = {.struct_size = sizeof di};
    if (!rc && dis && (loom_engine_kv_info(e, &pi, &err) || loom_engine_kv_info(d, &di, &err))) {
        fprintf(stderr, "pd_onegpu: %s\n", err.message);
        rc = 1;
    }
    if (!rc && dis && (pi.block_size != di.block_size || pi.block_bytes != di.block_bytes || pi.kv_dtype != di.kv_dtype)) {
        fprintf(stderr, "pd_onegpu: the engines' KV differs (block size %d vs %d, block bytes %zu vs %zu, KV dtype %d vs %d)\n",
                pi.block_size, di.block_size, pi.block_bytes, di.block_bytes, (int)pi.kv_dtype, (int)di.kv_dtype);
        rc = 1;
    }
    if (!rc) {
        if (dis) {
            hand.stop = false;
            pthread_create(&hand.th, NULL, hand_loop, NULL);
        }
        r1.e = e;
        pthread_create(&r1.th, NULL, step_loop, &r1);
        if (d) {
            r2.e = d;
            pthread_create(&r2.th, NULL, step_loop, &r2);
        }
        pf_ctx *ctx = calloc((size_t)(o->num > 2 * NBUF ? o->num : 2 * NBUF), sizeof *ctx);
        /* a warm-up request first (graphs, cuBLASLt plans, first-touch memory) */
        opts warm = *o; /* the longest prompts: the hand-over buffers reach their size here */
        warm.num = 2 * NBUF;
        warm.in_lo = o->in_hi;
        req *ww = make_workload(&warm, INFINITY, o->seed + 1000);
        double secs;
        if (!ctx || !ww || run_workload(&warm, ww, e, d, &r1, d ? &r2 : NULL, ctx, &secs)) rc = 1;
        free_workload(ww, warm.num);
        /* scale: one prefill-only phase (8 prompts of in-hi tokens, one
         * output each) and one decode phase (num prompts of in-lo tokens,
         * out-hi outputs), all at once: what the engine's SMs buy */
        opts ph[2] = {*o, *o};
        ph[0].num = 8, ph[0].in_lo = o->in_hi, ph[0].out_lo = ph[0].out_hi = 1;
        ph[1].in_hi = o->in_lo, ph[1].out_lo = o->out_hi;
        const bool scale = !strcmp(mode, "scale");
        const int phases = scale ? 2 : o->nrates;
        for (int k = 0; !rc && k < phases; k++) {
            const opts *po = scale ? &ph[k] : o;
            const double rate = scale ? INFINITY : o->rates[k];
            if (scale) printf("scale phase %s: %d requests of %d prompt tokens, %d outputs\n", k ? "decode" : "prefill",
                              po->num, po->in_lo, po->out_hi);
            req *w = make_workload(po, rate, o->seed + (unsigned)k);
            loom_engine_stats s1a, s1b, s2a, s2b;
            snapshot(&r1, &s1a);
            if (d) snapshot(&r2, &s2a);
            if (!w || run_workload(po, w, e, d, &r1, d ? &r2 : NULL, ctx, &secs)) {
                rc = 1;
                free_workload(w, po->num);
                break;
            }
            report(po, js, mode, rate, w, secs, *first);
            snapshot(&r1, &s1b);
            print_steps(dis ? "prefill" : "colocated", &s1a, &s1b);
            if (d) {
                snapshot(&r2, &s2b);
                print_steps("decode", &s2a, &s2b);
            }
            *first = false;
            if (w_out && k == phases - 1) *w_out = w;
            else free_workload(w, po->num);
        }
        atomic_store(&r1.stop, 1);
        pthread_join(r1.th, NULL);
        if (d) {
            atomic_store(&r2.stop, 1);
            pthread_join(r2.th, NULL);
            pthread_mutex_lock(&hand.mu);
            hand.stop = true;
            pthread_cond_broadcast(&hand.cv);
            pthread_mutex_unlock(&hand.mu);
            pthread_join(hand.th, NULL);
        }
        free(ctx);
    }
    if (d) loom_engine_destroy(d);
    if (e) loom_engine_destroy(e);
    return rc;
}

int main(int argc, char **argv) {
    opts o;
    if (argc < 2 || parse_args(argc, argv, &o)) return usage();
    /* the engine copies every hand-over (hundreds of MB on a GPU model):
     * keep freed memory in one heap for reuse instead of fresh mmap()s that
     * fault every page in again */
    g_in_hi = o.in_hi;
    mallopt(M_ARENA_MAX, 1);
    mallopt(M_MMAP_MAX, 0);
    mallopt(M_TRIM_THRESHOLD, INT32_MAX);
    FILE *js = NULL;
    if (o.json && !(js = fopen(o.json, "w"))) return fprintf(stderr, "pd_onegpu: cannot write %s\n", o.json), 1;
    if (js)
        fprintf(js, "{\"config\": \"%s\", \"num\": %d, \"in\": [%d, %d], \"out\": [%d, %d], \"ttft_slo_ms\": %.1f, "
                    "\"tpot_slo_ms\": %.1f, \"runs\": [\n", o.config, o.num, o.in_lo, o.in_hi, o.out_lo, o.out_hi,
                o.ttft_ms, o.tpot_ms);
    bool first = true;
    int rc = 0;
    if (!strcmp(o.mode, "check")) {
        req *a = NULL, *b = NULL;
        o.nrates = 1;
        o.rates[0] = INFINITY;
        rc = run_mode(&o, "colo", js, &first, &a) || run_mode(&o, "disagg", js, &first, &b);
        if (!rc) {
            int same = 0;
            for (int i = 0; i < o.num; i++) {
                bool eq = a[i].got == b[i].got && !memcmp(a[i].out, b[i].out, sizeof(int32_t) * (size_t)a[i].got);
                same += eq;
                if (!eq) {
                    int j = 0;
                    while (j < a[i].got && j < b[i].got && a[i].out[j] == b[i].out[j]) j++;
                    printf("check: request %d (%d prompt tokens) differs at output token %d of %d\n", i, a[i].n_in, j,
                           a[i].got);
                }
            }
            printf("check: %d of %d requests identical (greedy, colocated vs disaggregated)\n", same, o.num);
            rc = same != o.num;
        }
        free_workload(a, o.num);
        free_workload(b, o.num);
    } else {
        rc = run_mode(&o, o.mode, js, &first, NULL);
    }
    if (js) {
        fprintf(js, "\n]}\n");
        fclose(js);
    }
    return rc;
}
