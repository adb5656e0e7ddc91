/*
 * kernels/cpu/topk.c — the k largest logits of a row and its log-sum-exp
 * (loom_cpu_logits_topk): host->logits_topk_row's contract, on the pool.
 *
 * Why not the host's function: it is one scalar pass and a float64 exp a
 * vocabulary entry, on the step thread while the pool idles — ~1 ms a
 * token for Gemma 3's 262,144 entries, ~5% of a one-thread decode step.
 *
 * How: the row goes in chunks (their size a function of the vocabulary
 * alone, so the result does not depend on the thread count). A chunk keeps
 * its own k largest with the host's rules (8 lanes compared with the k-th
 * at a time, lanes that pass inserted in id order), its max and the sum of
 * e^(x - max) (vexp.h in float, summed in float64). The chunks' lists
 * merge in chunk order with the same insertion rule, which keeps equal
 * values in ascending id: the same ids and values as the host's. Their
 * sums merge as sum_c z_c e^(m_c - M): the log-sum-exp differs from the
 * host's float64 one by the float exps' error, a few parts in 10^7.
 */
#include "cpu_kernels.h"
#include "vexp.h"

#include <math.h>
#include <string.h>

#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#define TOPK_CLONES __attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default")))
#else
#define TOPK_CLONES
#endif

enum { TOPK_CHUNKS = 64, TOPK_MIN_CHUNK = 8192 };

typedef float topk_v4f __attribute__((vector_size(16)));
typedef double topk_v4d __attribute__((vector_size(32)));

typedef struct topk_part {
    int32_t ids[LOOM_CPU_TOPK_MAX];
    float vals[LOOM_CPU_TOPK_MAX];
    int32_t n;
    float mx;  /* max of the chunk's non-NaN raw values */
    double z;  /* sum of e^(x - mx) over them (0 when mx is +-inf) */
} topk_part;

typedef struct topk_ctx {
    const float *row;
    const uint32_t *allowed;
    int64_t vocab, chunk;
    int32_t k;
    topk_part *parts;
} topk_ctx;

/* x (NaN as -inf, a disallowed id as -inf) into the list of p: a later id
 * enters only when strictly greater than the k-th, so equal values stay
 * in the order they came. */
static inline void topk_insert(topk_part *p, int32_t k, int32_t id, float x) {
    if (p->n == k && !(x > p->vals[k - 1])) return;
    int32_t j = p->n < k ? p->n++ : k - 1;
    while (j > 0 && x > p->vals[j - 1]) {
        p->vals[j] = p->vals[j - 1];
        p->ids[j] = p->ids[j - 1];
        j--;
    }
    p->vals[j] = x;
    p->ids[j] = id;
}

static inline float topk_rank_value(const topk_ctx *c, int64_t v) {
    float x = c->row[v];
    if (x != x) x = -INFINITY;
    if (c->allowed && !((c->allowed[v >> 5] >> (v & 31)) & 1u)) x = -INFINITY;
    return x;
}

/* One chunk [b, e): its list and max in one pass, then its sum (inlined
 * into each target clone of topk_chunks). */
static inline __attribute__((always_inline)) void topk_chunk(const topk_ctx *c, int64_t b, int64_t e, topk_part *p) {
    const float *row = c->row;
    const int32_t k = c->k;
    p->n = 0;
    int64_t v = b;
    float mx = -INFINITY;
    for (; v < e && p->n < k; v++) { /* the first k enter whatever they are */
        if (row[v] > mx) mx = row[v];
        topk_insert(p, k, (int32_t)v, topk_rank_value(c, v));
    }
    loom_v8f mv = {mx, mx, mx, mx, mx, mx, mx, mx}, x;
    for (; v + 8 <= e; v += 8) {
        memcpy(&x, row + v, sizeof x);
        mv = loom_v8_select(x > mv, x, mv); /* NaN compares false: kept out */
        const float th = p->vals[k - 1];
        const loom_v8i pass = x > (loom_v8f){th, th, th, th, th, th, th, th};
        int any = 0;
        for (int l = 0; l < 8; l++) any |= pass[l];
        if (!any) continue;
        for (int l = 0; l < 8; l++) topk_insert(p, k, (int32_t)(v + l), topk_rank_value(c, v + l));
    }
    for (; v < e; v++) {
        if (row[v] > mx) mx = row[v];
        topk_insert(p, k, (int32_t)v, topk_rank_value(c, v));
    }
    for (int l = 0; l < 8; l++)
        if (mv[l] > mx) mx = mv[l];
    p->mx = mx;
    p->z = 0.0;
    if (!(mx > -INFINITY) || mx == INFINITY) return;
    /* e^(x - mx) <= 1 a term; NaN terms count 0 */
    const loom_v8f m8 = {mx, mx, mx, mx, mx, mx, mx, mx}, zero = {0};
    topk_v4d z0 = {0}, z1 = {0};
    for (v = b; v + 8 <= e; v += 8) {
        memcpy(&x, row + v, sizeof x);
        const loom_v8f t = loom_v8_select(x == x, loom_v8_exp(x - m8), zero);
        topk_v4f lo, hi;
        memcpy(&lo, &t, sizeof lo), memcpy(&hi, (const char *)&t + sizeof lo, sizeof hi);
        z0 += __builtin_convertvector(lo, topk_v4d);
        z1 += __builtin_convertvector(hi, topk_v4d);
    }
    z0 += z1;
    double z = (z0[0] + z0[1]) + (z0[2] + z0[3]);
    for (; v < e; v++)
        if (row[v] == row[v]) z += exp((double)row[v] - (double)mx);
    p->z = z;
}

TOPK_CLONES
static void topk_chunks(void *arg, int64_t b, int64_t e, int worker) {
    (void)worker;
    const topk_ctx *c = arg;
    for (int64_t i = b; i < e; i++) {
        const int64_t lo = i * c->chunk, hi = lo + c->chunk < c->vocab ? lo + c->chunk : c->vocab;
        topk_chunk(c, lo, hi, &c->parts[i]);
    }
}

void loom_cpu_logits_topk(const float *row, int64_t vocab, const uint32_t *allowed, int32_t k, int32_t *ids,
                          float *vals, float *lse, loom_cpu_pool *pool) {
    if (k <= 0) return;
    if (k > LOOM_CPU_TOPK_MAX) k = LOOM_CPU_TOPK_MAX; /* the caller checks; never overrun */
    int64_t chunk = (vocab + TOPK_CHUNKS - 1) / TOPK_CHUNKS;
    chunk = chunk < TOPK_MIN_CHUNK ? TOPK_MIN_CHUNK : (chunk + 7) & ~(int64_t)7;
    const int64_t nc = vocab > 0 ? (vocab + chunk - 1) / chunk : 0;
    topk_part parts[TOPK_CHUNKS];
    topk_ctx c = {.row = row, .allowed = allowed, .vocab = vocab, .chunk = chunk, .k = k, .parts = parts};
    loom_cpu_pool_for(pool, nc, 1, topk_chunks, &c);
    topk_part all = {.n = 0};
    float mx = -INFINITY;
    for (int64_t i = 0; i < nc; i++) {
        for (int32_t j = 0; j < parts[i].n; j++) topk_insert(&all, k, parts[i].ids[j], parts[i].vals[j]);
        if (parts[i].mx > mx) mx = parts[i].mx;
    }
    memcpy(ids, all.ids, (size_t)all.n * sizeof *ids);
    memcpy(vals, all.vals, (size_t)all.n * sizeof *vals);
    for (int32_t j = all.n; j < k; j++) ids[j] = -1, vals[j] = -INFINITY; /* k > vocab: padding */
    if (!(mx > -INFINITY) || mx == INFINITY) {
        *lse = mx;
        return;
    }
    double z = 0.0;
    for (int64_t i = 0; i < nc; i++)
        if (parts[i].mx > -INFINITY) z += parts[i].z * exp((double)parts[i].mx - (double)mx);
    *lse = (float)((double)mx + log(z));
}
