/*
 * bench/gpu/tp_comm_bench.c — what one collective costs between the GPUs
 * of this machine: NCCL's all-reduce / all-gather against the tp
 * executor's peer-to-peer kernels (plugins/executor/tp/tp_p2p.cu, compiled
 * in here), at the message sizes a tensor-parallel step makes (8 KB: a
 * batch-1 decode all-reduce of the Llama-3-8B shape; up to 8 MB), eagerly
 * and replayed from a CUDA graph (peer-to-peer only: NCCL calls captured in
 * a graph hung on two H200s). It first checks that the peer-to-peer
 * all-reduce and all-gather give the exact expected values.
 *
 *   tp_comm_bench [OUT.json]     (all visible GPUs, 2..8; NCCL_NVLS_ENABLE=0)
 *
 * One thread per GPU, as the tp executor runs its ranks; each thread times
 * `iters` calls back to back on its stream with CUDA events; the figure is
 * the slowest rank's time per call. Exit status: failed value checks.
 */
#include <cuda_runtime.h>
#include <nccl.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "formats/half.h"
#include "tp_p2p.h"

#define MAX_GPUS 8
#define CAP ((size_t)8 << 20)

#define CK(x)                                                                                      \
    do {                                                                                           \
        cudaError_t e_ = (x);                                                                      \
        if (e_ != cudaSuccess) {                                                                   \
            fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #x, cudaGetErrorString(e_));   \
            exit(100);                                                                             \
        }                                                                                          \
    } while (0)
#define NK(x)                                                                                      \
    do {                                                                                           \
        ncclResult_t r_ = (x);                                                                     \
        if (r_ != ncclSuccess) {                                                                   \
            fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #x, ncclGetErrorString(r_));   \
            exit(101);                                                                             \
        }                                                                                          \
    } while (0)

typedef enum { OP_NCCL_AR, OP_P2P_AR, OP_P2P_AR_GRAPH, OP_NCCL_AG, OP_P2P_AG, OP_P2P_AG_GRAPH, OP_COUNT } op_kind;
static const char *const op_names[OP_COUNT] = {"nccl all-reduce",      "p2p all-reduce",
                                               "p2p all-reduce, graph", "nccl all-gather",
                                               "p2p all-gather",       "p2p all-gather, graph"};

typedef struct shared {
    int n;
    ncclComm_t comms[MAX_GPUS];
    tp_p2p *p2p;
    pthread_barrier_t bar;
    /* the job */
    op_kind op;
    size_t bytes; /* per rank */
    int iters;
    double ms[MAX_GPUS];
    int bad[MAX_GPUS];
} shared;

typedef struct rank_ctx {
    shared *sh;
    int r;
    cudaStream_t s;
    void *buf, *recv;
    cudaEvent_t e0, e1;
} rank_ctx;

static void enqueue(rank_ctx *c, op_kind op, size_t bytes) {
    shared *sh = c->sh;
    switch (op) {
    case OP_NCCL_AR: NK(ncclAllReduce(c->buf, c->buf, bytes / 2, ncclBfloat16, ncclSum, sh->comms[c->r], c->s)); break;
    case OP_P2P_AR:
    case OP_P2P_AR_GRAPH: CK((cudaError_t)tp_p2p_all_reduce(sh->p2p, c->r, c->buf, (int64_t)(bytes / 2), TP_P2P_BF16, c->s)); break;
    case OP_NCCL_AG: NK(ncclAllGather(c->buf, c->recv, bytes / 4, ncclFloat32, sh->comms[c->r], c->s)); break;
    case OP_P2P_AG:
    case OP_P2P_AG_GRAPH: CK((cudaError_t)tp_p2p_all_gather(sh->p2p, c->r, c->buf, c->recv, (int64_t)bytes, c->s)); break;
    default: break;
    }
}

static void run_job(rank_ctx *c) {
    shared *sh = c->sh;
    const op_kind op = sh->op;
    const bool graph = op == OP_P2P_AR_GRAPH || op == OP_P2P_AG_GRAPH;
    for (int i = 0; i < 10; i++) enqueue(c, op, sh->bytes); /* warm-up */
    CK(cudaStreamSynchronize(c->s));
    cudaGraphExec_t exec = NULL;
    if (graph) {
        cudaGraph_t gr;
        CK(cudaStreamBeginCapture(c->s, cudaStreamCaptureModeThreadLocal));
        for (int i = 0; i < sh->iters; i++) enqueue(c, op, sh->bytes);
        CK(cudaStreamEndCapture(c->s, &gr));
        CK(cudaGraphInstantiate(&exec, gr, 0));
        CK(cudaGraphDestroy(gr));
        CK(cudaGraphLaunch(exec, c->s)); /* warm the graph */
        CK(cudaStreamSynchronize(c->s));
    }
    pthread_barrier_wait(&sh->bar);
    CK(cudaEventRecord(c->e0, c->s));
    if (graph) CK(cudaGraphLaunch(exec, c->s));
    else
        for (int i = 0; i < sh->iters; i++) enqueue(c, op, sh->bytes);
    CK(cudaEventRecord(c->e1, c->s));
    CK(cudaEventSynchronize(c->e1));
    float ms = 0;
    CK(cudaEventElapsedTime(&ms, c->e0, c->e1));
    sh->ms[c->r] = ms / sh->iters;
    if (exec) CK(cudaGraphExecDestroy(exec));
}

/* Exact values: rank r's bf16 elements are small integers (i % 7 + r + 1),
 * so every partial sum is exact in bf16 and float32 (formats/half.h). */
static void check_values(rank_ctx *c, size_t bytes) {
    shared *sh = c->sh;
    const size_t n = bytes / 2;
    uint16_t *h = malloc(bytes);
    for (size_t i = 0; i < n; i++) h[i] = loom_fp32_to_bf16((float)(i % 7 + c->r + 1));
    CK(cudaMemcpy(c->buf, h, bytes, cudaMemcpyHostToDevice));
    pthread_barrier_wait(&sh->bar);
    CK((cudaError_t)tp_p2p_all_reduce(sh->p2p, c->r, c->buf, (int64_t)n, TP_P2P_BF16, c->s));
    CK(cudaStreamSynchronize(c->s));
    CK(cudaMemcpy(h, c->buf, bytes, cudaMemcpyDeviceToHost));
    int bad = 0;
    for (size_t i = 0; i < n; i++) {
        float want = 0;
        for (int r = 0; r < sh->n; r++) want += (float)(i % 7 + r + 1);
        if (loom_bf16_to_fp32(h[i]) != want) bad++;
    }
    /* all-gather of float32 rank ids + index */
    const size_t nf = bytes / 4;
    float *f = malloc(bytes), *g = malloc(bytes * (size_t)sh->n);
    for (size_t i = 0; i < nf; i++) f[i] = (float)(c->r * 1000003 + (int)(i % 100000));
    CK(cudaMemcpy(c->buf, f, bytes, cudaMemcpyHostToDevice));
    pthread_barrier_wait(&sh->bar);
    CK((cudaError_t)tp_p2p_all_gather(sh->p2p, c->r, c->buf, c->recv, (int64_t)bytes, c->s));
    CK(cudaStreamSynchronize(c->s));
    CK(cudaMemcpy(g, c->recv, bytes * (size_t)sh->n, cudaMemcpyDeviceToHost));
    for (int r = 0; r < sh->n; r++)
        for (size_t i = 0; i < nf; i++)
            if (g[(size_t)r * nf + i] != (float)(r * 1000003 + (int)(i % 100000))) bad++;
    sh->bad[c->r] += bad;
    free(h), free(f), free(g);
}

static void *rank_main(void *arg) {
    rank_ctx *c = arg;
    shared *sh = c->sh;
    CK(cudaSetDevice(c->r));
    CK(cudaStreamCreateWithFlags(&c->s, cudaStreamNonBlocking));
    CK(cudaMalloc(&c->buf, CAP));
    CK(cudaMalloc(&c->recv, CAP * (size_t)sh->n));
    CK(cudaMemset(c->buf, 0, CAP));
    CK(cudaEventCreate(&c->e0));
    CK(cudaEventCreate(&c->e1));
    static const size_t check_sizes[] = {16, 8192, 8190, 1 << 20, CAP};
    for (size_t k = 0; k < sizeof check_sizes / sizeof check_sizes[0]; k++) check_values(c, check_sizes[k]);
    for (;;) {
        pthread_barrier_wait(&sh->bar); /* a job is posted */
        if (sh->iters == 0) break;
        run_job(c);
        pthread_barrier_wait(&sh->bar); /* done */
    }
    cudaFree(c->buf), cudaFree(c->recv);
    return NULL;
}

int main(int argc, char **argv) {
    setenv("NCCL_NVLS_ENABLE", "0", 0);
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess || n < 2) {
        printf("SKIP tp_comm_bench needs >= 2 GPUs (%d visible)\n", n);
        return 0;
    }
    if (n > MAX_GPUS) n = MAX_GPUS;
    static shared sh;
    sh.n = n;
    char why[200] = "";
    sh.p2p = tp_p2p_create(n, CAP, why, sizeof why);
    if (!sh.p2p) {
        printf("FAIL peer-to-peer collectives unavailable: %s\n", why);
        return 1;
    }
    int devs[MAX_GPUS];
    for (int i = 0; i < n; i++) devs[i] = i;
    NK(ncclCommInitAll(sh.comms, n, devs));
    pthread_barrier_init(&sh.bar, NULL, (unsigned)n + 1);
    rank_ctx ranks[MAX_GPUS];
    pthread_t th[MAX_GPUS];
    for (int i = 0; i < n; i++) {
        ranks[i] = (rank_ctx){.sh = &sh, .r = i};
        pthread_create(&th[i], NULL, rank_main, &ranks[i]);
    }
    /* the value checks run first in every thread, two barriers each */
    for (int k = 0; k < 5 * 2; k++) pthread_barrier_wait(&sh.bar);
    int bad = 0;
    for (int i = 0; i < n; i++) bad += sh.bad[i];
    printf("%s p2p all-reduce / all-gather exact values on %d GPUs (5 sizes, 16 B .. 8 MiB): %d wrong\n",
           bad ? "FAIL" : "PASS", n, bad);

    FILE *js = argc > 1 ? fopen(argv[1], "w") : NULL;
    if (js) fprintf(js, "{\n  \"gpus\": %d,\n  \"results\": [\n", n);
    static const size_t sizes[] = {8192, 16384, 65536, 262144, 1 << 20, 4 << 20, 8 << 20};
    printf("%-24s", "us per call (bytes/rank)");
    for (size_t k = 0; k < sizeof sizes / sizeof sizes[0]; k++) printf(" %9zuK", sizes[k] >> 10);
    printf("\n");
    bool first = true;
    for (int op = 0; op < OP_COUNT; op++) {
        printf("%-24s", op_names[op]);
        for (size_t k = 0; k < sizeof sizes / sizeof sizes[0]; k++) {
            sh.op = (op_kind)op, sh.bytes = sizes[k], sh.iters = sizes[k] <= (1 << 20) ? 200 : 50;
            pthread_barrier_wait(&sh.bar); /* post */
            pthread_barrier_wait(&sh.bar); /* wait */
            double worst = 0;
            for (int i = 0; i < n; i++)
                if (sh.ms[i] > worst) worst = sh.ms[i];
            printf(" %10.1f", worst * 1e3);
            fflush(stdout);
            if (js)
                fprintf(js, "%s    {\"op\": \"%s\", \"bytes_per_rank\": %zu, \"us_per_call\": %.3f}", first ? "" : ",\n",
                        op_names[op], sizes[k], worst * 1e3);
            first = false;
        }
        printf("\n");
    }
    sh.iters = 0;
    pthread_barrier_wait(&sh.bar);
    for (int i = 0; i < n; i++) pthread_join(th[i], NULL);
    if (js) fprintf(js, "\n  ]\n}\n"), fclose(js);
    for (int i = 0; i < n; i++) ncclCommDestroy(sh.comms[i]);
    tp_p2p_destroy(sh.p2p);
    return bad ? 1 : 0;
}
