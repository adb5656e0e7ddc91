/*
 * kernels/cpu/attention.c — the paged KV cache on the CPU: writing K/V
 * through the slot mapping, float16 conversion, and causal paged attention
 * with an online softmax (FlashAttention's algorithm, one query row at a
 * time), optionally over a sliding window of keys (Gemma 3's local layers;
 * keys before the window are never read, whatever the cache still holds).
 *
 * Layout (loom/backend.h): each pool is (num_blocks, num_kv_heads,
 * block_size, head_dim), so the keys of one (block, kv head) are block_size
 * consecutive rows of head_dim floats — a tile we stream through.
 *
 * Per (token, head) the kernel keeps a running max m, running sum l and an
 * unnormalised output acc (head_dim); each key tile updates them:
 *   m' = max(m, max_j s_j);  l' = l e^(m - m') + sum_j e^(s_j - m');
 *   acc' = acc e^(m - m') + sum_j e^(s_j - m') v_j
 * and the result is acc / l. Nothing of size (T, context) is ever formed.
 * Keys go in chunks of 512 positions, each chunk's state from scratch and
 * the chunks' states merged in order (the same rescaling), so the chunks of
 * a decode step's query can run on different threads (attn_items).
 */
#include "cpu_kernels.h"
#include "qlinear.h" /* E4M3 rows for an FP8 KV cache */

#include "formats/half.h"
#include "vexp.h"

#include <math.h>
#include <string.h>

#if defined(__x86_64__)
#include <immintrin.h>
#define CPU_HAVE_F16C_PATH 1
#endif

/* ------------------------------------------------------------ float16 */

/* The vector path is F16C's; the scalar one (and every tail) is
 * formats/half.h's, which rounds as F16C does (to nearest even). */

/* What the KV cache stores of x in f16: x, with |x| above the largest
 * finite half (65504) saturated to +-65504 as the E4M3 cache saturates at
 * 448 — an inf key or value would turn every later score or output of
 * that head into inf or NaN (0 * inf where a probability underflows). NaN
 * stays NaN. */
#define KV_F16_MAX 65504.0f
static inline float kv_f16_clamp(float x) {
    return x > KV_F16_MAX ? KV_F16_MAX : x < -KV_F16_MAX ? -KV_F16_MAX : x;
}

#ifdef CPU_HAVE_F16C_PATH
/* sat: clamp first (kv_f16_clamp; max / min return their second operand
 * when one is NaN, which keeps NaN) */
__attribute__((target("avx,f16c"))) static void f32_to_f16_f16c(uint16_t *dst, const float *src,
                                                                 int64_t n, bool sat) {
    const __m256 hi = _mm256_set1_ps(KV_F16_MAX), lo = _mm256_set1_ps(-KV_F16_MAX);
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) {
        __m256 x = _mm256_loadu_ps(src + i);
        if (sat) x = _mm256_min_ps(hi, _mm256_max_ps(lo, x));
        _mm_storeu_si128((__m128i *)(dst + i), _mm256_cvtps_ph(x, _MM_FROUND_TO_NEAREST_INT));
    }
    for (; i < n; i++) dst[i] = loom_fp32_to_fp16(sat ? kv_f16_clamp(src[i]) : src[i]);
}

__attribute__((target("avx,f16c"))) static void f16_to_f32_f16c(float *dst, const uint16_t *src,
                                                                 int64_t n) {
    int64_t i = 0;
    for (; i + 8 <= n; i += 8)
        _mm256_storeu_ps(dst + i, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(src + i))));
    for (; i < n; i++) dst[i] = loom_fp16_to_fp32(src[i]);
}

static bool cpu_has_f16c(void) {
    /* libgcc initialises the CPU model before main; this is a load */
    return __builtin_cpu_supports("f16c") && __builtin_cpu_supports("avx");
}
#endif

static void f32_to_f16_row(uint16_t *dst, const float *src, int64_t n, bool sat) {
#ifdef CPU_HAVE_F16C_PATH
    if (cpu_has_f16c()) {
        f32_to_f16_f16c(dst, src, n, sat);
        return;
    }
#endif
    for (int64_t i = 0; i < n; i++) dst[i] = loom_fp32_to_fp16(sat ? kv_f16_clamp(src[i]) : src[i]);
}

void loom_cpu_f32_to_f16(uint16_t *dst, const float *src, int64_t n) { f32_to_f16_row(dst, src, n, false); }

void loom_cpu_f16_to_f32(float *dst, const uint16_t *src, int64_t n) {
#ifdef CPU_HAVE_F16C_PATH
    if (cpu_has_f16c()) {
        f16_to_f32_f16c(dst, src, n);
        return;
    }
#endif
    for (int64_t i = 0; i < n; i++) dst[i] = loom_fp16_to_fp32(src[i]);
}

/* ------------------------------------------------------------ KV write */

void loom_cpu_kv_write(const loom_cpu_kv *kv, const float *k, int64_t ldk, const float *v,
                       int64_t ldv, const int64_t *slot_mapping, int64_t T) {
    const int64_t D = kv->head_dim, bs = kv->block_size, H = kv->num_kv_heads;
    for (int64_t t = 0; t < T; t++) {
        int64_t slot = slot_mapping[t];
        if (slot < 0) continue;
        int64_t blk = slot / bs, off = slot % bs;
        for (int64_t h = 0; h < H; h++) {
            int64_t dst = ((blk * H + h) * bs + off) * D; /* elements */
            const float *ks = k + t * ldk + h * D, *vs = v + t * ldv + h * D;
            if (kv->dtype == LOOM_DTYPE_F16) {
                f32_to_f16_row((uint16_t *)kv->k + dst, ks, D, true);
                f32_to_f16_row((uint16_t *)kv->v + dst, vs, D, true);
            } else if (kv->dtype == LOOM_DTYPE_FP8_E4M3) {
                /* scale 1.0: |x| > 448 saturates (see cpu_kernels.h) */
                loom_cpu_f32_to_e4m3((uint8_t *)kv->k + dst, ks, D, 1.0f);
                loom_cpu_f32_to_e4m3((uint8_t *)kv->v + dst, vs, D, 1.0f);
            } else {
                memcpy((float *)kv->k + dst, ks, (size_t)D * sizeof(float));
                memcpy((float *)kv->v + dst, vs, (size_t)D * sizeof(float));
            }
        }
    }
}

/* ------------------------------------------------------------ attention */

/* A work item is up to ATTN_QB consecutive tokens of one sequence times up
 * to ATTN_HG query heads that share a KV head: each key and value row is
 * read once for all of them (12 queries for SmolLM2's 3 heads a KV head)
 * instead of once a query. Scores, the softmax's exps and the value
 * accumulation run 8 floats a vector (docs/performance.md, the CPU
 * section, has what this saves in a prefill). */
#define ATTN_TILE 32 /* keys scored at a time (the online-softmax tile)       */
#define ATTN_QB 4    /* consecutive tokens of one sequence an item serves      */
#define ATTN_HG 4    /* query heads of one KV head an item serves, at most     */
#define ATTN_MAXQ (ATTN_QB * ATTN_HG)
/* Below this many multiply-adds (sum over tokens of keys x heads x head_dim)
 * attention runs on the calling thread: a decode step at short context. */
#define ATTN_PARALLEL_MIN (1 << 18)

#define ATTN_INLINE static inline __attribute__((always_inline))
#define ATTN_LD(v, p) memcpy(&(v), (p), sizeof(loom_v8f))
#define ATTN_ST(p, v) memcpy((p), &(v), sizeof(loom_v8f))

typedef float attn_v4 __attribute__((vector_size(16)));

ATTN_INLINE float attn_hsum8(loom_v8f v) {
    attn_v4 a = __builtin_shufflevector(v, v, 0, 1, 2, 3) + __builtin_shufflevector(v, v, 4, 5, 6, 7);
    return (a[0] + a[2]) + (a[1] + a[3]);
}

/* The lane sums of a0, a1, a2, a3, in that order, in one vector. */
ATTN_INLINE attn_v4 attn_hsum4x8(loom_v8f a0, loom_v8f a1, loom_v8f a2, loom_v8f a3) {
    /* halves added: s01 = [a0 (4 lanes), a1 (4)], s23 = [a2, a3] */
    loom_v8f s01 = __builtin_shufflevector(a0, a1, 0, 1, 2, 3, 8, 9, 10, 11) +
                   __builtin_shufflevector(a0, a1, 4, 5, 6, 7, 12, 13, 14, 15);
    loom_v8f s23 = __builtin_shufflevector(a2, a3, 0, 1, 2, 3, 8, 9, 10, 11) +
                   __builtin_shufflevector(a2, a3, 4, 5, 6, 7, 12, 13, 14, 15);
    /* two lanes each: [a0 a0 a2 a2 a1 a1 a3 a3] */
    loom_v8f u = __builtin_shufflevector(s01, s23, 0, 1, 8, 9, 4, 5, 12, 13) +
                 __builtin_shufflevector(s01, s23, 2, 3, 10, 11, 6, 7, 14, 15);
    return __builtin_shufflevector(u, u, 0, 4, 2, 6) + __builtin_shufflevector(u, u, 1, 5, 3, 7);
}

/* S[i][c + j] = scale (q_i . k_j) for i < nq, j < nn: q (nq, D), k (nn,
 * D), rows contiguous. Four keys a pass share each query load (a key's
 * score has the same bits whether it is one of four or alone). */
ATTN_INLINE void attn_scores(float (*S)[ATTN_TILE], int c, const float *q, int nq, const float *k,
                             int nn, int64_t D, float scale) {
    const int64_t D8 = D & ~(int64_t)7;
    for (int i = 0; i < nq; i++) {
        const float *qi = q + i * D;
        int j = 0;
        for (; j + 4 <= nn; j += 4) {
            const float *k0 = k + j * D, *k1 = k0 + D, *k2 = k1 + D, *k3 = k2 + D;
            loom_v8f a0 = {0}, a1 = {0}, a2 = {0}, a3 = {0}, x, y;
            for (int64_t d = 0; d < D8; d += 8) {
                ATTN_LD(x, qi + d);
                ATTN_LD(y, k0 + d), a0 += x * y;
                ATTN_LD(y, k1 + d), a1 += x * y;
                ATTN_LD(y, k2 + d), a2 += x * y;
                ATTN_LD(y, k3 + d), a3 += x * y;
            }
            attn_v4 s = attn_hsum4x8(a0, a1, a2, a3);
            for (int64_t d = D8; d < D; d++) {
                s[0] += qi[d] * k0[d], s[1] += qi[d] * k1[d];
                s[2] += qi[d] * k2[d], s[3] += qi[d] * k3[d];
            }
            s *= scale;
            memcpy(&S[i][c + j], &s, sizeof s);
        }
        for (; j < nn; j++) {
            const float *kj = k + j * D;
            loom_v8f a = {0}, x, y;
            for (int64_t d = 0; d < D8; d += 8) {
                ATTN_LD(x, qi + d), ATTN_LD(y, kj + d);
                a += x * y;
            }
            float s = attn_hsum8(a);
            for (int64_t d = D8; d < D; d++) s += qi[d] * kj[d];
            S[i][c + j] = s * scale;
        }
    }
}

/* acc_r (D) += sum_j p_r[j] v_j for the four rows r, j < nn; v (nn, D). */
ATTN_INLINE void attn_pv4(float *const *acc, const float *const *p, const float *v, int nn, int64_t D) {
    int64_t d = 0;
    for (; d + 16 <= D; d += 16) {
        loom_v8f a[4][2], x0, x1;
        for (int r = 0; r < 4; r++) ATTN_LD(a[r][0], acc[r] + d), ATTN_LD(a[r][1], acc[r] + d + 8);
        for (int j = 0; j < nn; j++) {
            ATTN_LD(x0, v + j * D + d), ATTN_LD(x1, v + j * D + d + 8);
            for (int r = 0; r < 4; r++) {
                const float pj = p[r][j];
                a[r][0] += pj * x0, a[r][1] += pj * x1;
            }
        }
        for (int r = 0; r < 4; r++) ATTN_ST(acc[r] + d, a[r][0]), ATTN_ST(acc[r] + d + 8, a[r][1]);
    }
    for (; d + 8 <= D; d += 8) {
        loom_v8f a[4], x;
        for (int r = 0; r < 4; r++) ATTN_LD(a[r], acc[r] + d);
        for (int j = 0; j < nn; j++) {
            ATTN_LD(x, v + j * D + d);
            for (int r = 0; r < 4; r++) a[r] += p[r][j] * x;
        }
        for (int r = 0; r < 4; r++) ATTN_ST(acc[r] + d, a[r]);
    }
    for (; d < D; d++)
        for (int j = 0; j < nn; j++)
            for (int r = 0; r < 4; r++) acc[r][d] += p[r][j] * v[j * D + d];
}

/* Sequence owning token t: the last s with query_start[s] <= t (empty
 * sequences share their start with the next one and are skipped). */
static int32_t attn_seq_of(const int32_t *qs, int32_t S, int64_t t) {
    int32_t lo = 0, hi = S - 1;
    while (lo < hi) {
        int32_t mid = lo + (hi - lo + 1) / 2;
        if (qs[mid] <= t) lo = mid;
        else hi = mid - 1;
    }
    return lo;
}

/* n consecutive key/value elements of the pool from `elem` as float32:
 * the pool itself for F32, or a conversion into `tmp` for F16 / FP8 E4M3. */
static inline const float *attn_rows(const void *base, loom_dtype dt, int64_t elem, float *tmp,
                                     int64_t n) {
    if (dt == LOOM_DTYPE_F16) {
        loom_cpu_f16_to_f32(tmp, (const uint16_t *)base + elem, n);
        return tmp;
    }
    if (dt == LOOM_DTYPE_FP8_E4M3) {
        loom_cpu_e4m3_to_f32(tmp, (const uint8_t *)base + elem, n, 1.0f);
        return tmp;
    }
    return (const float *)base + elem;
}

/* The first key position a query at position p sees: 0, or the start of
 * its sliding window (the last `window` positions, p included). */
static inline int64_t attn_first_key(const loom_cpu_attn_args *a, int64_t p) {
    return a->window > 0 && p + 1 > a->window ? p + 1 - a->window : 0;
}

/* Keys go in chunks of attn_chunk_keys (a whole number of blocks, from
 * position 0): a query's softmax state is computed chunk by chunk, each
 * from scratch, and the chunks' states merged in order. Where a call has
 * fewer work items than threads can use (a decode step at long context)
 * the chunks of one query run on different threads (FlashDecoding's split
 * of the keys; each key and value row still read once for the query heads
 * that share it) and a second pass merges them; elsewhere one item walks
 * its chunks in turn. Both do the same arithmetic in the same order, so a
 * query's output does not depend on which ran, on the threads, or on the
 * tokens that share its call. */
#define ATTN_CHUNK 512 /* keys a chunk, rounded to whole blocks */

static inline int64_t attn_chunk_keys(int64_t bs) { return bs >= ATTN_CHUNK ? bs : ATTN_CHUNK / bs * bs; }

typedef struct attn_job {
    const loom_cpu_attn_args *a;
    int32_t hg;   /* query heads an item serves          */
    int32_t nsub; /* items a (token chunk, KV head) has  */
    int64_t nch;  /* split: key chunks a query has at most (0: not split) */
} attn_job;

/* Merges chunk state (mc, lc, ac) into (m, l, acc) for one query: the first
 * chunk with keys is taken as it is, later ones rescaled to the larger max.
 * The fmaf are explicit: the unsplit merge runs inside attn_items' x86-64-v3
 * / v4 clones, where the compiler would contract a * b + c into an FMA, and
 * the split one outside them, where it would not — and both must round
 * alike. */
static inline void attn_merge(float *m, float *l, float *acc, float mc, float lc, const float *ac, int64_t D) {
    if (mc == -INFINITY) return; /* no key of this query in the chunk */
    if (*m == -INFINITY) {
        *m = mc, *l = lc;
        memcpy(acc, ac, (size_t)D * sizeof(float));
        return;
    }
    const float mn = mc > *m ? mc : *m, c0 = expf(*m - mn), c1 = expf(mc - mn);
    *l = fmaf(*l, c0, lc * c1);
    for (int64_t d = 0; d < D; d++) acc[d] = fmaf(acc[d], c0, ac[d] * c1);
    *m = mn;
}

/* Blocks of the paged cache lie anywhere in the pool, so the hardware
 * prefetcher cannot follow a query from one to the next: a decode step at
 * long context waited on each block's first lines. Ask for the keys and
 * values of the block ATTN_PF ahead while this one is scored (results do
 * not change: a prefetch moves no value). */
#define ATTN_PF 2
static inline void attn_prefetch(const loom_cpu_kv *kv, int64_t blk, int64_t kvh, int64_t esz) {
    const int64_t bytes = kv->block_size * kv->head_dim * esz;
    const int64_t off = (blk * kv->num_kv_heads + kvh) * kv->block_size * kv->head_dim * esz;
    const char *k = (const char *)kv->k + off, *v = (const char *)kv->v + off;
    for (int64_t b = 0; b < bytes; b += 64) __builtin_prefetch(k + b, 0, 3), __builtin_prefetch(v + b, 0, 3);
}

/* Tokens [t0, t1) of sequence s, at consecutive positions, query heads
 * [h0, h0 + nh) of KV head kvh, keys [c0, c1) of the cache (a chunk):
 * each query's state over those keys into m, l, acc ((nq + 1) x D; the
 * last row a spare). Every key from the first token's first visible one to
 * the last token's position is in the cache (this step's were written
 * before), so a tile is read whole and each query masks what it may not
 * see: keys after its position or before its window. Tiles are the same
 * for every query whatever the run (ATTN_TILE keys from the block's start;
 * keys before the run's first visible one are -inf, not read), and a key
 * sits in the same lane of its tile: a query's sums, maxima and rescalings
 * happen in the same order alone or in a run, so its output has the same
 * bits (kernels.paged_attention_is_batch_invariant). */
ATTN_INLINE void attn_run(const loom_cpu_attn_args *a, int64_t t0, int64_t t1, int32_t s, int64_t kvh,
                          int32_t h0, int32_t nh, int64_t c0, int64_t c1, float *m, float *l, float *acc) {
    const loom_cpu_kv *kv = a->kv;
    const int64_t D = kv->head_dim, bs = kv->block_size, KVH = kv->num_kv_heads;
    const int nt = (int)(t1 - t0), nq = nt * nh;
    float qb[ATTN_MAXQ * LOOM_CPU_MAX_HEAD_DIM] __attribute__((aligned(32)));
    float kt[ATTN_TILE * LOOM_CPU_MAX_HEAD_DIM] __attribute__((aligned(32)));
    float vt[ATTN_TILE * LOOM_CPU_MAX_HEAD_DIM] __attribute__((aligned(32)));
    float S[ATTN_MAXQ + 1][ATTN_TILE] __attribute__((aligned(32)));
    int64_t pq[ATTN_QB], lq[ATTN_QB];

    for (int ti = 0; ti < nt; ti++) {
        pq[ti] = a->positions[t0 + ti];
        lq[ti] = attn_first_key(a, pq[ti]);
        for (int hh = 0; hh < nh; hh++)
            memcpy(qb + (ti * nh + hh) * D, a->q + (t0 + ti) * a->ldq + (int64_t)(h0 + hh) * D,
                   (size_t)D * sizeof(float));
    }
    for (int i = 0; i < nq; i++) m[i] = -INFINITY, l[i] = 0.0f;
    /* row nq of acc and S: where the missing rows of a group of 4 go */
    memset(acc, 0, (size_t)(nq + 1) * D * sizeof(float));
    memset(S[nq], 0, sizeof S[nq]);

    const int32_t *bt = a->block_table + (int64_t)s * a->block_table_stride;
    const int64_t klo = lq[0] > c0 ? lq[0] : c0, khi = pq[nt - 1] < c1 - 1 ? pq[nt - 1] : c1 - 1;
    const int64_t esz = kv->dtype == LOOM_DTYPE_F16 ? 2 : kv->dtype == LOOM_DTYPE_FP8_E4M3 ? 1 : 4;
    for (int64_t j0 = klo - klo % bs; j0 <= khi; j0 += bs) {
        const int64_t blk = bt[j0 / bs];
        const int64_t n = khi + 1 - j0 < bs ? khi + 1 - j0 : bs; /* keys of this block */
        const int64_t row0 = (blk * KVH + kvh) * bs * D;          /* element offset   */
        if (j0 + ATTN_PF * bs <= khi) attn_prefetch(kv, bt[j0 / bs + ATTN_PF], kvh, esz);
        for (int64_t i0 = j0 < klo ? (klo - j0) / ATTN_TILE * ATTN_TILE : 0; i0 < n; i0 += ATTN_TILE) {
            const int nn = (int)(n - i0 < ATTN_TILE ? n - i0 : ATTN_TILE); /* tile's keys */
            const int js = (int)(j0 + i0 < klo ? klo - j0 - i0 : 0);      /* first read  */
            const int64_t kp0 = j0 + i0; /* position of the tile's first key */
            for (int i = 0; i < nq; i++)
                for (int j = 0; j < js; j++) S[i][j] = -INFINITY;
            attn_scores(S, js, qb, nq, attn_rows(kv->k, kv->dtype, row0 + (i0 + js) * D, kt, (nn - js) * D),
                        nn - js, D, a->scale);
            for (int ti = 0; ti < nt; ti++) {
                if (kp0 + nn - 1 <= pq[ti] && kp0 + js >= lq[ti]) continue;
                for (int j = js; j < nn; j++)
                    if (kp0 + j > pq[ti] || kp0 + j < lq[ti])
                        for (int hh = 0; hh < nh; hh++) S[ti * nh + hh][j] = -INFINITY;
            }
            const int nn8 = (nn + 7) & ~7;
            for (int i = 0; i < nq; i++) {
                float tmax = -INFINITY;
                for (int j = js; j < nn; j++) tmax = S[i][j] > tmax ? S[i][j] : tmax;
                const float mn = tmax > m[i] ? tmax : m[i];
                if (mn == -INFINITY) { /* no key of this query so far */
                    memset(S[i], 0, sizeof S[i]);
                    continue;
                }
                for (int j = nn; j < nn8; j++) S[i][j] = -INFINITY;
                loom_v8f sum = {0}, x;
                for (int j = 0; j < nn8; j += 8) {
                    ATTN_LD(x, &S[i][j]);
                    x = loom_v8_exp(x - mn);
                    ATTN_ST(&S[i][j], x);
                    sum += x;
                }
                const float corr = expf(m[i] - mn); /* 0 on the first keys (m = -inf) */
                l[i] = l[i] * corr + attn_hsum8(sum);
                if (corr != 1.0f) {
                    float *ac = acc + i * D;
                    for (int64_t d = 0; d < D; d++) ac[d] *= corr;
                }
                m[i] = mn;
            }
            const float *vr = attn_rows(kv->v, kv->dtype, row0 + (i0 + js) * D, vt, (nn - js) * D);
            for (int i = 0; i < nq; i += 4) {
                float *ar[4];
                const float *pr[4];
                for (int r = 0; r < 4; r++) {
                    const int ii = i + r < nq ? i + r : nq;
                    ar[r] = acc + ii * D, pr[r] = S[ii] + js;
                }
                attn_pv4(ar, pr, vr, nn - js, D);
            }
        }
    }
}

/* The output of one query from its merged state. */
static inline void attn_out(float *o, float l, const float *acc, int64_t D) {
    const float inv = 1.0f / l;
    for (int64_t d = 0; d < D; d++) o[d] = acc[d] * inv;
}

/* A run (as attn_run) over all its keys: chunk by chunk, merged in order,
 * then its outputs. */
ATTN_INLINE void attn_run_all(const loom_cpu_attn_args *a, int64_t t0, int64_t t1, int32_t s, int64_t kvh,
                              int32_t h0, int32_t nh) {
    const int64_t D = a->kv->head_dim, ck = attn_chunk_keys(a->kv->block_size);
    const int nt = (int)(t1 - t0), nq = nt * nh;
    float mc[ATTN_MAXQ], lc[ATTN_MAXQ], m[ATTN_MAXQ], l[ATTN_MAXQ];
    float ac[(ATTN_MAXQ + 1) * LOOM_CPU_MAX_HEAD_DIM] __attribute__((aligned(32)));
    float acc[ATTN_MAXQ * LOOM_CPU_MAX_HEAD_DIM] __attribute__((aligned(32)));
    for (int i = 0; i < nq; i++) m[i] = -INFINITY, l[i] = 0.0f;
    /* zeros, so a query no chunk gave a key (NaN scores) ends NaN, not garbage */
    memset(acc, 0, (size_t)nq * D * sizeof(float));
    const int64_t klo = attn_first_key(a, a->positions[t0]), khi = a->positions[t1 - 1];
    for (int64_t c = klo / ck; c <= khi / ck; c++) {
        attn_run(a, t0, t1, s, kvh, h0, nh, c * ck, (c + 1) * ck, mc, lc, ac);
        for (int i = 0; i < nq; i++) attn_merge(&m[i], &l[i], acc + i * D, mc[i], lc[i], ac + i * D, D);
    }
    for (int ti = 0; ti < nt; ti++)
        for (int hh = 0; hh < nh; hh++) {
            const int i = ti * nh + hh;
            attn_out(a->out + (t0 + ti) * a->ldo + (int64_t)(h0 + hh) * D, l[i], acc + i * D, D);
        }
}

/* Items [b, e): item = (chunk of ATTN_QB tokens, KV head, head subgroup).
 * A chunk's tokens go in runs of one sequence at consecutive positions.
 * Split (job->nch > 0): item = (token, KV head, head subgroup, key chunk),
 * its state into a->part. Built for x86-64-v4 / v3 / baseline, picked at
 * load. */
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
__attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default")))
#endif
static void attn_items(void *arg, int64_t b, int64_t e, int worker) {
    (void)worker;
    const attn_job *job = arg;
    const loom_cpu_attn_args *a = job->a;
    const int64_t KVH = a->kv->num_kv_heads, T = a->num_tokens, H = a->num_heads, D = a->kv->head_dim;
    const int32_t G = a->num_heads / a->kv->num_kv_heads;
    const int64_t per = KVH * job->nsub * (job->nch > 0 ? job->nch : 1); /* items a token (chunk) */
    for (int64_t item = b; item < e; item++) {
        const int64_t c = item / per, r = item % per;
        const int64_t kc = job->nch > 0 ? r % job->nch : 0, r2 = job->nch > 0 ? r / job->nch : r;
        const int64_t kvh = r2 / job->nsub;
        const int32_t sub = (int32_t)(r2 % job->nsub);
        const int32_t h0 = (int32_t)kvh * G + sub * job->hg;
        const int32_t nh = G - sub * job->hg < job->hg ? G - sub * job->hg : job->hg;
        if (job->nch > 0) { /* token c, key chunk kc */
            const int64_t ck = attn_chunk_keys(a->kv->block_size);
            float m[ATTN_HG], l[ATTN_HG];
            float acc[(ATTN_HG + 1) * LOOM_CPU_MAX_HEAD_DIM] __attribute__((aligned(32)));
            attn_run(a, c, c + 1, attn_seq_of(a->query_start, a->num_seqs, c), kvh, h0, nh, kc * ck,
                     (kc + 1) * ck, m, l, acc);
            for (int hh = 0; hh < nh; hh++) {
                float *st = a->part + ((c * H + h0 + hh) * job->nch + kc) * (D + 2);
                st[0] = m[hh], st[1] = l[hh];
                memcpy(st + 2, acc + hh * D, (size_t)D * sizeof(float));
            }
            continue;
        }
        const int64_t c1 = (c + 1) * ATTN_QB < T ? (c + 1) * ATTN_QB : T;
        for (int64_t t0 = c * ATTN_QB, t1; t0 < c1; t0 = t1) {
            const int32_t s = attn_seq_of(a->query_start, a->num_seqs, t0);
            const int64_t end = a->query_start[s + 1] < c1 ? a->query_start[s + 1] : c1;
            for (t1 = t0 + 1; t1 < end && a->positions[t1] == a->positions[t1 - 1] + 1;) t1++;
            attn_run_all(a, t0, t1, s, kvh, h0, nh);
        }
    }
}

/* Split's second pass: items (token, head) merge their chunks in order. */
static void attn_merge_items(void *arg, int64_t b, int64_t e, int worker) {
    (void)worker;
    const attn_job *job = arg;
    const loom_cpu_attn_args *a = job->a;
    const int64_t H = a->num_heads, D = a->kv->head_dim;
    float acc[LOOM_CPU_MAX_HEAD_DIM];
    for (int64_t item = b; item < e; item++) {
        const int64_t t = item / H, h = item % H;
        float m = -INFINITY, l = 0.0f;
        memset(acc, 0, (size_t)D * sizeof(float)); /* as attn_run_all */
        for (int64_t kc = 0; kc < job->nch; kc++) {
            const float *st = a->part + (item * job->nch + kc) * (D + 2);
            attn_merge(&m, &l, acc, st[0], st[1], st + 2, D);
        }
        attn_out(a->out + t * a->ldo + h * D, l, acc, D);
    }
}

/* key chunks a query at position pmax spans (from position 0), and the
 * floats of a->part a split of the call's queries over them needs */
static int64_t attn_chunks(const loom_cpu_attn_args *a, int64_t pmax) {
    return pmax / attn_chunk_keys(a->kv->block_size) + 1;
}
static int64_t attn_part_need(const loom_cpu_attn_args *a, int64_t nch) {
    return (int64_t)a->num_tokens * a->num_heads * nch * (a->kv->head_dim + 2);
}

int64_t loom_cpu_attention_part_floats(const loom_cpu_attn_args *a) {
    if (a->num_tokens <= 0) return 0;
    int64_t pmax = 0;
    for (int64_t t = 0; t < a->num_tokens; t++) pmax = a->positions[t] > pmax ? a->positions[t] : pmax;
    return attn_part_need(a, attn_chunks(a, pmax));
}

void loom_cpu_paged_attention(const loom_cpu_attn_args *a, loom_cpu_pool *pool) {
    int64_t T = a->num_tokens, H = a->num_heads, KVH = a->kv->num_kv_heads;
    if (T <= 0) return;
    double work = 0;
    int64_t pmax = 0;
    for (int64_t t = 0; t < T; t++) {
        work += (double)(a->positions[t] + 1 - attn_first_key(a, a->positions[t]));
        pmax = a->positions[t] > pmax ? a->positions[t] : pmax;
    }
    work *= (double)H * a->kv->head_dim;
    if (work < ATTN_PARALLEL_MIN) pool = NULL;
    const int32_t G = (int32_t)(H / KVH);
    attn_job job = {.a = a, .nsub = (G + ATTN_HG - 1) / ATTN_HG};
    job.hg = (G + job.nsub - 1) / job.nsub;
    const int64_t chunks = (T + ATTN_QB - 1) / ATTN_QB;
    const int64_t threads = pool ? (int64_t)loom_cpu_pool_size(pool) : 1;
    if (pool && chunks * KVH * job.nsub < 4 * threads) {
        /* few items for the threads (a decode step at long context): split
         * the keys when they span chunks and a->part holds the states,
         * else one query head an item, so the heads spread over them */
        const int64_t nch = attn_chunks(a, pmax);
        if (nch > 1 && threads > 1 && a->part && attn_part_need(a, nch) <= a->part_floats) {
            job.nch = nch;
            loom_cpu_pool_for(pool, T * KVH * job.nsub * nch, 1, attn_items, &job);
            loom_cpu_pool_for(T * H >= 4 * threads ? pool : NULL, T * H, 1, attn_merge_items, &job);
            return;
        }
        job.hg = 1, job.nsub = G;
    }
    loom_cpu_pool_for(pool, chunks * KVH * job.nsub, 1, attn_items, &job);
}
