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
 */
#include "cpu_kernels.h"
#include "qlinear.h" /* E4M3 rows for an FP8 KV cache */

#include "formats/half.h"

#include <math.h>
#include <string.h>

#if defined(__x86_64__)
#include <immintrin.h>
#define CPU_HAVE_F16C_PATH 1
#endif

/* Keys scored at a time inside a block (the online-softmax tile). */
#define ATTN_TILE 32
/* Below this many multiply-adds (sum over tokens of keys x heads x head_dim)
 * attention runs on the calling thread: a decode step at short context. */
#define ATTN_PARALLEL_MIN (1 << 18)

/* ------------------------------------------------------------ float16 */

/* The vector path is F16C's; the scalar one (and every tail) is
 * formats/half.h's, which rounds as F16C does (to nearest even). */

#ifdef CPU_HAVE_F16C_PATH
__attribute__((target("avx,f16c"))) static void f32_to_f16_f16c(uint16_t *dst, const float *src,
                                                                 int64_t n) {
    int64_t i = 0;
    for (; i + 8 <= n; i += 8)
        _mm_storeu_si128((__m128i *)(dst + i),
                         _mm256_cvtps_ph(_mm256_loadu_ps(src + i), _MM_FROUND_TO_NEAREST_INT));
    for (; i < n; i++) dst[i] = loom_fp32_to_fp16(src[i]);
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

void loom_cpu_f32_to_f16(uint16_t *dst, const float *src, int64_t n) {
#ifdef CPU_HAVE_F16C_PATH
    if (cpu_has_f16c()) {
        f32_to_f16_f16c(dst, src, n);
        return;
    }
#endif
    for (int64_t i = 0; i < n; i++) dst[i] = loom_fp32_to_fp16(src[i]);
}

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
                loom_cpu_f32_to_f16((uint16_t *)kv->k + dst, ks, D);
                loom_cpu_f32_to_f16((uint16_t *)kv->v + dst, vs, D);
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

static inline float attn_dot(const float *a, const float *b, int64_t n) {
    float acc[8] = {0};
    int64_t i = 0;
    for (; i + 8 <= n; i += 8)
        for (int j = 0; j < 8; j++) acc[j] += a[i + j] * b[i + j];
    float s = ((acc[0] + acc[4]) + (acc[1] + acc[5])) + ((acc[2] + acc[6]) + (acc[3] + acc[7]));
    for (; i < n; i++) s += a[i] * b[i];
    return s;
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

/* Key/value row j of a tile as float32: the pool row itself for F32, or a
 * conversion into `tmp` for F16 / FP8 E4M3. */
static inline const float *attn_row(const void *base, loom_dtype dt, int64_t elem, float *tmp,
                                    int64_t D) {
    if (dt == LOOM_DTYPE_F16) {
        loom_cpu_f16_to_f32(tmp, (const uint16_t *)base + elem, D);
        return tmp;
    }
    if (dt == LOOM_DTYPE_FP8_E4M3) {
        loom_cpu_e4m3_to_f32(tmp, (const uint8_t *)base + elem, D, 1.0f);
        return tmp;
    }
    return (const float *)base + elem;
}

/* The first key position a query at position p sees: 0, or the start of
 * its sliding window (the last `window` positions, p included). */
static inline int64_t attn_first_key(const loom_cpu_attn_args *a, int64_t p) {
    return a->window > 0 && p + 1 > a->window ? p + 1 - a->window : 0;
}

/* Built for x86-64-v4 / v3 / baseline, picked at load: the dot and the
 * value accumulation run 8 or 16 lanes wide with FMA instead of SSE2's 4. */
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
__attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default")))
#endif
static void attn_items(void *arg, int64_t b, int64_t e, int worker) {
    (void)worker;
    const loom_cpu_attn_args *a = arg;
    const loom_cpu_kv *kv = a->kv;
    const int64_t D = kv->head_dim, bs = kv->block_size, KVH = kv->num_kv_heads;
    const int32_t H = a->num_heads, group = a->num_heads / kv->num_kv_heads;
    float acc[LOOM_CPU_MAX_HEAD_DIM], kt[LOOM_CPU_MAX_HEAD_DIM], vt[LOOM_CPU_MAX_HEAD_DIM];
    float sc[ATTN_TILE];

    for (int64_t item = b; item < e; item++) {
        int64_t t = item / H;
        int32_t h = (int32_t)(item % H);
        int32_t s = attn_seq_of(a->query_start, a->num_seqs, t);
        int64_t p = a->positions[t];
        int64_t kvh = h / group;
        const float *q = a->q + t * a->ldq + (int64_t)h * D;
        const int32_t *bt = a->block_table + (int64_t)s * a->block_table_stride;

        float m = -INFINITY, l = 0.0f;
        for (int64_t d = 0; d < D; d++) acc[d] = 0.0f;

        const int64_t lo = attn_first_key(a, p);
        for (int64_t j0 = lo - lo % bs; j0 <= p; j0 += bs) {
            int64_t blk = bt[j0 / bs];
            int64_t n = p + 1 - j0 < bs ? p + 1 - j0 : bs; /* keys of this block */
            int64_t row0 = (blk * KVH + kvh) * bs * D;      /* element offset   */
            for (int64_t i0 = j0 < lo ? lo - j0 : 0; i0 < n; i0 += ATTN_TILE) {
                int64_t nn = n - i0 < ATTN_TILE ? n - i0 : ATTN_TILE;
                float tmax = -INFINITY;
                for (int64_t j = 0; j < nn; j++) {
                    const float *kr = attn_row(kv->k, kv->dtype, row0 + (i0 + j) * D, kt, D);
                    sc[j] = attn_dot(q, kr, D) * a->scale;
                    if (sc[j] > tmax) tmax = sc[j];
                }
                float m_new = tmax > m ? tmax : m;
                float corr = expf(m - m_new); /* 0 on the first tile (m = -inf) */
                l *= corr;
                if (corr != 1.0f)
                    for (int64_t d = 0; d < D; d++) acc[d] *= corr;
                for (int64_t j = 0; j < nn; j++) {
                    float pj = expf(sc[j] - m_new);
                    l += pj;
                    const float *vr = attn_row(kv->v, kv->dtype, row0 + (i0 + j) * D, vt, D);
                    for (int64_t d = 0; d < D; d++) acc[d] += pj * vr[d];
                }
                m = m_new;
            }
        }
        float *o = a->out + t * a->ldo + (int64_t)h * D;
        float inv = 1.0f / l;
        for (int64_t d = 0; d < D; d++) o[d] = acc[d] * inv;
    }
}

void loom_cpu_paged_attention(const loom_cpu_attn_args *a, loom_cpu_pool *pool) {
    int64_t T = a->num_tokens, H = a->num_heads;
    if (T <= 0) return;
    double work = 0;
    for (int64_t t = 0; t < T; t++) work += (double)(a->positions[t] + 1 - attn_first_key(a, a->positions[t]));
    work *= (double)H * a->kv->head_dim;
    if (work < ATTN_PARALLEL_MIN) pool = NULL;
    loom_cpu_pool_for(pool, T * H, 1, attn_items, (void *)a);
}
