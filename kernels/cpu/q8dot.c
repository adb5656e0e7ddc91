/*
 * kernels/cpu/q8dot.c — the activation quantizer, the portable row kernels
 * and the pick of an instruction set (see q8dot.h). The x86 kernels are
 * q8dot_x86.h, built once per instruction set (q8dot_avx2.c,
 * q8dot_avx512.c); AVX-512 VNNI runs q8dot_tile.c's block-exact kernels.
 */
#include "q8dot.h"

#include "formats/gguf_blocks.h"

#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <string.h>

size_t loom_cpu_q8_bytes(int64_t K) { return (size_t)K + 5 * sizeof(float) * (size_t)(K / 32); }

void loom_cpu_q8_quantize_portable(const float *x, int64_t K, void *buf, loom_cpu_q8 *out) {
    const int64_t nb = K / LOOM_CPU_Q8_BLOCK;
    int8_t *q = buf;
    float *d = (float *)(q + K), *s = d + nb;
    int32_t *n = (int32_t *)(s + nb), *h = n + nb;
    for (int64_t b = 0; b < nb; b++) {
        const float *xb = x + 32 * b;
        float amax = 0.0f;
        for (int j = 0; j < 32; j++) { /* not fmaxf: a libm call per element here */
            const float a = fabsf(xb[j]);
            amax = a > amax ? a : amax;
        }
        const float db = amax / 127.0f, inv = amax > 0.0f ? 127.0f / amax : 0.0f;
        int32_t half[2] = {0, 0};
        for (int j = 0; j < 32; j++) {
            const int32_t v = (int32_t)rintf(xb[j] * inv);
            q[32 * b + j] = (int8_t)v;
            half[j / 16] += v;
        }
        const int32_t sum = half[0] + half[1];
        d[b] = db;
        s[b] = db * (float)sum;
        n[b] = sum;
        h[2 * b] = half[0];
        h[2 * b + 1] = half[1];
    }
    *out = (loom_cpu_q8){.q = q, .d = d, .s = s, .n = n, .h = h};
}

size_t loom_cpu_q8g_bytes(int64_t K) { return LOOM_CPU_Q8_G * loom_cpu_q8_bytes(K); }

void loom_cpu_q8g_pack(const loom_cpu_q8 *x, int mr, int64_t K, void *buf, loom_cpu_q8g *out) {
    const int64_t nb = K / LOOM_CPU_Q8_BLOCK;
    int8_t *q = buf;
    float *d = (float *)(q + LOOM_CPU_Q8_G * K), *s = d + LOOM_CPU_Q8_G * nb;
    int32_t *n = (int32_t *)(s + LOOM_CPU_Q8_G * nb), *h = n + LOOM_CPU_Q8_G * nb;
    for (int64_t b = 0; b < nb; b++)
        for (int t = 0; t < LOOM_CPU_Q8_G; t++) {
            const loom_cpu_q8 *xt = &x[t < mr ? t : 0];
            memcpy(q + (LOOM_CPU_Q8_G * b + t) * 32, xt->q + 32 * b, 32);
            d[LOOM_CPU_Q8_G * b + t] = xt->d[b];
            s[LOOM_CPU_Q8_G * b + t] = xt->s[b];
            n[LOOM_CPU_Q8_G * b + t] = xt->n[b];
            h[2 * (LOOM_CPU_Q8_G * b + t)] = xt->h[2 * b];
            h[2 * (LOOM_CPU_Q8_G * b + t) + 1] = xt->h[2 * b + 1];
        }
    *out = (loom_cpu_q8g){.q = q, .d = d, .s = s, .n = n, .h = h};
}

/* ------------------------------------------------------------ portable */

/* The 32-element block types with one scale and an offset: q4_0 (w = d (q -
 * 8)) and q4_1 (w = d q + m). The codes stay unsigned; the offset meets
 * the activations' d * sum. A block's codes are unpacked once for all the
 * tokens of a call (qp_codes also builds q5_0's 0..31, which qp_q8 dots
 * signed). */
enum { QP_Q4_0, QP_Q4_1, QP_Q5_0 };

/* Bytes p[0..8) as a little-endian word, and back (one load / store on a
 * little-endian CPU, right on any). */
static inline uint64_t qp_le64(const uint8_t *p) {
    uint64_t v = 0;
    for (int k = 0; k < 8; k++) v |= (uint64_t)p[k] << (8 * k);
    return v;
}

static inline void qp_st64(uint8_t *p, uint64_t v) {
    for (int k = 0; k < 8; k++) p[k] = (uint8_t)(v >> (8 * k));
}

/* A block's 32 codes in element order, once for every token. q5_0 builds
 * them in 64-bit words: byte k of h * 0x01..01 masked with 1 << k keeps
 * bit k of h, adding 0x7F carries it into bit 7 (no byte overflows), and
 * >> 3 puts it at bit 4. (A loop over the 32 bits with variable shifts or
 * byte stores ran 5x slower than q4_0 on baseline x86-64.) */
static inline void qp_codes(const uint8_t *blk, const int kind, uint8_t *c) {
    if (kind != QP_Q5_0) {
        const uint8_t *qs = blk + (kind == QP_Q4_1 ? 4 : 2);
        for (int j = 0; j < 16; j++) c[j] = qs[j] & 15, c[j + 16] = qs[j] >> 4;
        return;
    }
    const uint8_t *qs = blk + LOOM_GGUF_Q5_0_QS, *h = blk + LOOM_GGUF_Q5_0_QH; /* bit j: element j */
    const uint64_t m4 = 0x0F0F0F0F0F0F0F0Full, q0 = qp_le64(qs), q1 = qp_le64(qs + 8);
    const uint64_t lo[4] = {q0 & m4, q1 & m4, (q0 >> 4) & m4, (q1 >> 4) & m4};
    for (int i = 0; i < 4; i++) {
        uint64_t v = (h[i] * 0x0101010101010101ull) & 0x8040201008040201ull;
        v = ((v + 0x7F7F7F7F7F7F7F7Full) & 0x8080808080808080ull) >> 3;
        qp_st64(c + 8 * i, lo[i] | v);
    }
}

static void qp_q4(const uint8_t *row, int64_t K, const loom_cpu_q8 *x, int mr, float *out,
                  const int kind) {
    const size_t bb = kind == QP_Q4_1 ? LOOM_GGUF_Q4_1_BYTES : LOOM_GGUF_Q4_0_BYTES;
    float acc[LOOM_CPU_Q8_MR] = {0};
    for (int64_t b = 0; b < K / 32; b++) {
        const uint8_t *blk = row + (size_t)b * bb;
        const float d = loom_gguf_f16(blk);
        const float m = kind == QP_Q4_1 ? loom_gguf_f16(blk + 2) : -8.0f * d;
        uint8_t c[32];
        qp_codes(blk, kind, c);
        for (int t = 0; t < mr; t++) {
            const int8_t *xq = x[t].q + 32 * b;
            int32_t s = 0;
            for (int j = 0; j < 32; j++) s += c[j] * xq[j];
            acc[t] += d * x[t].d[b] * (float)s + m * x[t].s[b];
        }
    }
    for (int t = 0; t < mr; t++) out[t] = acc[t];
}

static void qp_q4_0(const uint8_t *row, int64_t K, const loom_cpu_q8 *x, int mr, float *out) {
    qp_q4(row, K, x, mr, out, QP_Q4_0);
}

static void qp_q4_1(const uint8_t *row, int64_t K, const loom_cpu_q8 *x, int mr, float *out) {
    qp_q4(row, K, x, mr, out, QP_Q4_1);
}

/* q8_0 and q5_0 (q5 = 1): signed codes and one scale a block. q5_0's codes
 * minus 16 are q8_0's block of the same values, so its result is the q8_0
 * kernel's on that block, bit for bit (no offset term). */
static void qp_q8(const uint8_t *row, int64_t K, const loom_cpu_q8 *x, int mr, float *out, const int q5) {
    float acc[LOOM_CPU_Q8_MR] = {0};
    for (int64_t b = 0; b < K / 32; b++) {
        const uint8_t *blk = row + (size_t)b * (q5 ? LOOM_GGUF_Q5_0_BYTES : LOOM_GGUF_Q8_0_BYTES);
        int8_t c[32];
        const int8_t *w = (const int8_t *)(blk + 2);
        if (q5) {
            uint8_t u[32];
            qp_codes(blk, QP_Q5_0, u);
            for (int j = 0; j < 32; j++) c[j] = (int8_t)(u[j] - 16);
            w = c;
        }
        const float d = loom_gguf_f16(blk);
        for (int t = 0; t < mr; t++) {
            const int8_t *xq = x[t].q + 32 * b;
            int32_t s = 0;
            for (int j = 0; j < 32; j++) s += w[j] * xq[j];
            acc[t] += d * x[t].d[b] * (float)s;
        }
    }
    for (int t = 0; t < mr; t++) out[t] = acc[t];
}

static void qp_q5_0(const uint8_t *row, int64_t K, const loom_cpu_q8 *x, int mr, float *out) {
    qp_q8(row, K, x, mr, out, 1);
}

static void qp_q8_0(const uint8_t *row, int64_t K, const loom_cpu_q8 *x, int mr, float *out) {
    qp_q8(row, K, x, mr, out, 0);
}

/* q4_k (q5 = 0) and q5_k (q5 = 1): the same scales and nibbles; q5_k's
 * sub-block j takes its codes' bit 4 from bit j of qh[l]. */
static void qp_qk(const uint8_t *row, int64_t K, const loom_cpu_q8 *x, int mr, float *out,
                  const int q5) {
    const size_t bb = q5 ? LOOM_GGUF_Q5_K_BYTES : LOOM_GGUF_Q4_K_BYTES;
    const size_t qs_at = q5 ? LOOM_GGUF_Q5_K_QS : LOOM_GGUF_Q4_K_QS;
    for (int t = 0; t < mr; t++) {
        float acc = 0.0f;
        for (int64_t sb = 0; sb < K / 256; sb++) {
            const uint8_t *blk = row + (size_t)sb * bb, *qh = blk + LOOM_GGUF_Q5_K_QH;
            const float d = loom_gguf_f16(blk), dmin = loom_gguf_f16(blk + 2);
            uint32_t sw[3];
            memcpy(sw, blk + LOOM_GGUF_Q4_K_SCALES, sizeof sw);
            for (int j = 0; j < 8; j++) {
                const uint8_t *q = blk + qs_at + 32 * (j >> 1);
                const int sh = 4 * (j & 1);
                const int64_t xb = 8 * sb + j;
                const int8_t *xq = x[t].q + 32 * xb;
                uint32_t sc, mn;
                loom_q4k_scale_min(sw, j, &sc, &mn);
                int32_t s = 0;
                for (int l = 0; l < 32; l++) {
                    const int hb = q5 ? ((qh[l] >> j) & 1) << 4 : 0;
                    s += (((q[l] >> sh) & 15) | hb) * xq[l];
                }
                acc += d * (float)sc * x[t].d[xb] * (float)s - dmin * (float)mn * x[t].s[xb];
            }
        }
        out[t] = acc;
    }
}

static void qp_q4_k(const uint8_t *row, int64_t K, const loom_cpu_q8 *x, int mr, float *out) {
    qp_qk(row, K, x, mr, out, 0);
}

static void qp_q5_k(const uint8_t *row, int64_t K, const loom_cpu_q8 *x, int mr, float *out) {
    qp_qk(row, K, x, mr, out, 1);
}

static void qp_q6_k(const uint8_t *row, int64_t K, const loom_cpu_q8 *x, int mr, float *out) {
    for (int t = 0; t < mr; t++) {
        float acc = 0.0f;
        for (int64_t sb = 0; sb < K / 256; sb++) {
            const uint8_t *blk = row + (size_t)sb * LOOM_GGUF_Q6_K_BYTES;
            const float d = loom_gguf_f16(blk + LOOM_GGUF_Q6_K_D);
            for (int s = 0; s < 8; s++) {
                const loom_q6k_sub g = loom_q6k_sub_at(s);
                const int64_t xb = 8 * sb + s;
                const int8_t *xq = x[t].q + 32 * xb;
                for (int h = 0; h < 2; h++) {
                    int32_t sum = 0;
                    for (int l = 16 * h; l < 16 * h + 16; l++) {
                        const int q = (((blk[g.lo + l] >> g.nsh) & 15) |
                                       (((blk[g.ho + l] >> g.hsh) & 3) << 4)) - 32;
                        sum += q * xq[l];
                    }
                    acc += d * (float)(int8_t)blk[g.sc + h] * x[t].d[xb] * (float)sum;
                }
            }
        }
        out[t] = acc;
    }
}

loom_cpu_q8dot_fn *const loom_cpu_q8dot_portable[LOOM_CPU_Q8_NKINDS] = {
    [LOOM_CPU_Q8_Q4_0] = qp_q4_0, [LOOM_CPU_Q8_Q4_1] = qp_q4_1, [LOOM_CPU_Q8_Q8_0] = qp_q8_0,
    [LOOM_CPU_Q8_Q4_K] = qp_q4_k, [LOOM_CPU_Q8_Q6_K] = qp_q6_k, [LOOM_CPU_Q8_Q5_K] = qp_q5_k,
    [LOOM_CPU_Q8_Q5_0] = qp_q5_0};

/* Two rows as two row calls. */
#define QP_PAIR(name, row)                                                                        \
    static void name(const uint8_t *r0, const uint8_t *r1, int64_t K, const loom_cpu_q8 *x,       \
                     float *out) {                                                                \
        row(r0, K, x, 1, out);                                                                    \
        row(r1, K, x, 1, out + 1);                                                                \
    }
QP_PAIR(qp2_q4_0, qp_q4_0)
QP_PAIR(qp2_q4_1, qp_q4_1)
QP_PAIR(qp2_q8_0, qp_q8_0)
QP_PAIR(qp2_q4_k, qp_q4_k)
QP_PAIR(qp2_q6_k, qp_q6_k)
QP_PAIR(qp2_q5_k, qp_q5_k)
QP_PAIR(qp2_q5_0, qp_q5_0)

loom_cpu_q8dot2_fn *const loom_cpu_q8dot2_portable[LOOM_CPU_Q8_NKINDS] = {
    [LOOM_CPU_Q8_Q4_0] = qp2_q4_0, [LOOM_CPU_Q8_Q4_1] = qp2_q4_1, [LOOM_CPU_Q8_Q8_0] = qp2_q8_0,
    [LOOM_CPU_Q8_Q4_K] = qp2_q4_k, [LOOM_CPU_Q8_Q6_K] = qp2_q6_k, [LOOM_CPU_Q8_Q5_K] = qp2_q5_k,
    [LOOM_CPU_Q8_Q5_0] = qp2_q5_0};

/* Four rows as four row calls. */
#define QP_QUAD(name, row)                                                                        \
    static void name(const uint8_t *r0, size_t stride, int64_t K, const loom_cpu_q8 *x,           \
                     float *out) {                                                                \
        for (int r = 0; r < 4; r++) row(r0 + (size_t)r * stride, K, x, 1, out + r);               \
    }
QP_QUAD(qp4_q4_0, qp_q4_0)
QP_QUAD(qp4_q4_1, qp_q4_1)
QP_QUAD(qp4_q8_0, qp_q8_0)
QP_QUAD(qp4_q4_k, qp_q4_k)
QP_QUAD(qp4_q6_k, qp_q6_k)
QP_QUAD(qp4_q5_k, qp_q5_k)
QP_QUAD(qp4_q5_0, qp_q5_0)

loom_cpu_q8dot4_fn *const loom_cpu_q8dot4_portable[LOOM_CPU_Q8_NKINDS] = {
    [LOOM_CPU_Q8_Q4_0] = qp4_q4_0, [LOOM_CPU_Q8_Q4_1] = qp4_q4_1, [LOOM_CPU_Q8_Q8_0] = qp4_q8_0,
    [LOOM_CPU_Q8_Q4_K] = qp4_q4_k, [LOOM_CPU_Q8_Q6_K] = qp4_q6_k, [LOOM_CPU_Q8_Q5_K] = qp4_q5_k,
    [LOOM_CPU_Q8_Q5_0] = qp4_q5_0};

/* 16-bit weights: float products summed in element order (the x86 kernels
 * sum 16 lanes apart, so the instruction sets agree to float32 rounding). */
static void qp_h(const uint8_t *row, int64_t K, const float *const *x, int mr, float *out,
                 const int bf) {
    for (int t = 0; t < mr; t++) {
        float acc = 0.0f;
        for (int64_t k = 0; k < K; k++) {
            const uint16_t h = (uint16_t)(row[2 * k] | row[2 * k + 1] << 8);
            acc += (bf ? loom_bf16_to_fp32(h) : loom_fp16_to_fp32(h)) * x[t][k];
        }
        out[t] = acc;
    }
}

static void qp_h_f16(const uint8_t *row, int64_t K, const float *const *x, int mr, float *out) {
    qp_h(row, K, x, mr, out, 0);
}

static void qp_h_bf16(const uint8_t *row, int64_t K, const float *const *x, int mr, float *out) {
    qp_h(row, K, x, mr, out, 1);
}

loom_cpu_hdot_fn *const loom_cpu_hdot_portable[2] = {qp_h_f16, qp_h_bf16};

/* ------------------------------------------------------------ the pick */

typedef struct qd_isa {
    const char *name;
    loom_cpu_q8dot_fn *const *table;
    loom_cpu_q8dot2_fn *const *table2;
    loom_cpu_q8dot4_fn *const *table4;
    loom_cpu_q8gemm_fn *const *tableg; /* NULL: none */
    loom_cpu_hdot_fn *const *htable;
    const loom_cpu_q8exact *exact;     /* NULL: none */
    void (*quantize)(const float *x, int64_t K, void *buf, loom_cpu_q8 *out);
    int (*usable)(void);
} qd_isa;

#if defined(__x86_64__) && defined(__GNUC__)
static int qd_has_vnni(void) {
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx512vnni") && __builtin_cpu_supports("avx512vl") &&
           __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("fma");
}
static int qd_has_avx512(void) {
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512vl") &&
           __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("fma");
}
static int qd_has_avx2(void) {
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
}
#endif
static int qd_always(void) { return 1; }

/* Best first. */
static const qd_isa qd_isas[] = {
#if defined(__x86_64__) && defined(__GNUC__)
    /* every block type's rows, pairs, quads and groups are the tiles' (the
     * exact table covers all kinds); the quantizer and the 16-bit kernels
     * are AVX-512's */
    {"avx512vnni", NULL, NULL, NULL, NULL, loom_cpu_hdot_avx512, &loom_cpu_q8exact_vnni,
     loom_cpu_q8_quantize_avx512, qd_has_vnni},
    {"avx512", loom_cpu_q8dot_avx512, loom_cpu_q8dot2_avx512, loom_cpu_q8dot4_avx512,
     loom_cpu_q8gemm_avx512, loom_cpu_hdot_avx512, NULL, loom_cpu_q8_quantize_avx512, qd_has_avx512},
    {"avx2", loom_cpu_q8dot_avx2, loom_cpu_q8dot2_avx2, loom_cpu_q8dot4_avx2,
     loom_cpu_q8gemm_avx2, loom_cpu_hdot_avx2, NULL, loom_cpu_q8_quantize_avx2, qd_has_avx2},
#endif
    {"portable", loom_cpu_q8dot_portable, loom_cpu_q8dot2_portable, loom_cpu_q8dot4_portable,
     NULL, loom_cpu_hdot_portable, NULL, loom_cpu_q8_quantize_portable, qd_always},
};

static const qd_isa *qd_best;
static _Atomic(const qd_isa *) qd_cur;
static pthread_once_t qd_once = PTHREAD_ONCE_INIT;

static void qd_pick(void) {
    for (size_t i = 0; i < sizeof qd_isas / sizeof qd_isas[0]; i++)
        if (qd_isas[i].usable()) {
            qd_best = &qd_isas[i];
            break;
        }
    atomic_store(&qd_cur, qd_best);
}

/* The current choice, read once per product. */
static const qd_isa *qd_now(void) {
    pthread_once(&qd_once, qd_pick);
    return atomic_load_explicit(&qd_cur, memory_order_relaxed);
}

bool loom_cpu_q8_force_isa(const char *name) {
    pthread_once(&qd_once, qd_pick);
    if (!name) {
        atomic_store(&qd_cur, qd_best);
        return true;
    }
    for (size_t i = 0; i < sizeof qd_isas / sizeof qd_isas[0]; i++)
        if (!strcmp(qd_isas[i].name, name) && qd_isas[i].usable()) {
            atomic_store(&qd_cur, &qd_isas[i]);
            return true;
        }
    return false;
}

const char *loom_cpu_q8_isa(void) { return qd_now()->name; }

const char *loom_cpu_q8_best_isa(void) {
    pthread_once(&qd_once, qd_pick);
    return qd_best->name;
}

/* Index of a block type in the tables, or -1. */
static int qd_kind(loom_dtype dtype) {
    switch (dtype) {
    case LOOM_DTYPE_Q4_0: return LOOM_CPU_Q8_Q4_0;
    case LOOM_DTYPE_Q4_1: return LOOM_CPU_Q8_Q4_1;
    case LOOM_DTYPE_Q8_0: return LOOM_CPU_Q8_Q8_0;
    case LOOM_DTYPE_Q4_K: return LOOM_CPU_Q8_Q4_K;
    case LOOM_DTYPE_Q6_K: return LOOM_CPU_Q8_Q6_K;
    case LOOM_DTYPE_Q5_K: return LOOM_CPU_Q8_Q5_K;
    case LOOM_DTYPE_Q5_0: return LOOM_CPU_Q8_Q5_0;
    default: return -1;
    }
}

void loom_cpu_q8_quantize(const float *x, int64_t K, void *buf, loom_cpu_q8 *out) {
    qd_now()->quantize(x, K, buf, out);
}

/* A set's block-exact kernel of kind k, where it has one, else its table's. */
#define QD_PICK(isa, k, field, table)                                                        \
    (((isa)->exact && (isa)->exact->field[k]) ? (isa)->exact->field[k]                       \
                                              : ((isa)->table ? (isa)->table[k] : NULL))

loom_cpu_q8dot_fn *loom_cpu_q8dot(loom_dtype dtype) {
    const int k = qd_kind(dtype);
    return k < 0 ? NULL : QD_PICK(qd_now(), k, row, table);
}

loom_cpu_q8dot2_fn *loom_cpu_q8dot2(loom_dtype dtype) {
    const int k = qd_kind(dtype);
    return k < 0 ? NULL : QD_PICK(qd_now(), k, pair, table2);
}

loom_cpu_q8dot4_fn *loom_cpu_q8dot4(loom_dtype dtype) {
    const int k = qd_kind(dtype);
    return k < 0 ? NULL : QD_PICK(qd_now(), k, quad, table4);
}

loom_cpu_q8gemm_fn *loom_cpu_q8gemm(loom_dtype dtype) {
    const int k = qd_kind(dtype);
    return k < 0 ? NULL : QD_PICK(qd_now(), k, group, tableg);
}

const loom_cpu_q8tile_kernel *loom_cpu_q8tile(loom_dtype dtype) {
    const int k = qd_kind(dtype);
    const qd_isa *isa = qd_now();
    return k < 0 || !isa->exact ? NULL : isa->exact->tile[k];
}

size_t loom_cpu_q8tile_bytes(int64_t K) { return (size_t)(K / 32) * LOOM_CPU_Q8_TILE_BLOCK; }

loom_cpu_hdot_fn *loom_cpu_hdot(loom_dtype dtype) {
    if (dtype != LOOM_DTYPE_F16 && dtype != LOOM_DTYPE_BF16) return NULL;
    return qd_now()->htable[dtype == LOOM_DTYPE_BF16];
}
