/*
 * kernels/cpu/q8dot_x86.h — the x86 row kernels of q8dot.h, written once
 * and built once per instruction set: q8dot_avx2.c (-mavx2 -mfma -mf16c)
 * and q8dot_avx512.c (adds AVX-512 F, BW, VL) include it with QD_TABLE,
 * QD_TABLE2 and QD_TABLE4 naming the tables, QD_QUANTIZE the activation
 * quantizer, QD_HTABLE the 16-bit float kernels, QD_AVX512 0 or 1 (the
 * file's own instruction set, not whatever -m flags the build adds). The
 * unsigned x signed byte dot multiplies pairs into int16 (maddubs) and adds
 * pairs into int32 (madd): int32 lane i holds the sum over bytes 4i..4i+3.
 * (AVX-512 also turns q5_0's bit field into bytes with a mask move:
 * qd_q5_0_bits.) AVX-512 VNNI has no build of this file: every block type
 * runs q8dot_tile.c's block-exact kernels there.
 *
 * Shape of every kernel: one weight row, up to LOOM_CPU_Q8_MR tokens; each
 * weight block is unpacked to bytes once and dotted with every token's
 * block (MR is a constant after inlining; missing tokens alias token 0 and
 * are never stored). Per block: int32 lanes -> float, times the product of
 * the weight's and the activation's scales, into one of two float
 * accumulators (alternating, so consecutive FMAs do not wait on each
 * other).
 */
#include "q8dot_codes.h"

#include <math.h>

/* Sum over groups of four of u (unsigned bytes) x s (signed bytes). */
QD_INLINE __m256i qd_dot(__m256i u, __m256i s) {
    return _mm256_madd_epi16(_mm256_maddubs_epi16(u, s), _mm256_set1_epi16(1));
}

/* Signed w x signed s: |w| x (s with w's sign); |w| <= 128 and |s| <= 127
 * keep maddubs's int16 pairs below saturation. */
QD_INLINE __m256i qd_dot_ss(__m256i w, __m256i s) {
    return qd_dot(_mm256_sign_epi8(w, w), _mm256_sign_epi8(s, w));
}

QD_INLINE float qd_hsum(__m256 v) {
    __m128 a = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    a = _mm_add_ps(a, _mm_movehl_ps(a, a));
    a = _mm_add_ss(a, _mm_movehdup_ps(a));
    return _mm_cvtss_f32(a);
}

/* The 32-element block types with one scale and one offset a block, dotted
 * alike (codes unsigned, the offset times the activations' d * sum apart):
 * q4_0 (w = d (q - 8)) and q4_1 (w = d q + m). `kind` is a constant after
 * inlining. */
enum { QD_KIND_Q4_0, QD_KIND_Q4_1 };

QD_INLINE size_t qd_q4_bytes(const int kind) {
    return kind == QD_KIND_Q4_1 ? LOOM_GGUF_Q4_1_BYTES : LOOM_GGUF_Q4_0_BYTES;
}

/* A block's scale d in lane 0 of the result and its offset (-8 d or m) in
 * lane 1: q4_1's two f16 sit side by side and convert in one instruction;
 * q4_0's d stays in the vector unit, and one multiply by (1, -8) makes both
 * lanes (exact: a power of two). */
QD_INLINE __m128 qd_q4_dm(const uint8_t *blk, const int kind) {
    if (kind == QD_KIND_Q4_1) {
        int32_t dm;
        memcpy(&dm, blk, 4);
        return _mm_cvtph_ps(_mm_cvtsi32_si128(dm));
    }
    uint16_t h;
    memcpy(&h, blk, 2);
    const __m128 d = _mm_moveldup_ps(_mm_cvtph_ps(_mm_cvtsi32_si128(h)));
    return _mm_mul_ps(d, _mm_setr_ps(1.0f, -8.0f, 0.0f, 0.0f));
}

/* A q4 block's 32 codes as unsigned bytes, in element order. */
QD_INLINE __m256i qd_q4_codes(const uint8_t *blk, const int kind) {
    return qd_nibbles16(blk + (kind == QD_KIND_Q4_1 ? 4 : 2));
}

/* The two block types with signed codes and one scale a block, dotted
 * alike: q8_0 (32 int8 codes) and q5_0 (q5 = 1: codes nibble | bit 4 from
 * qh, minus 16, which is q8_0's block of the same values — the result is
 * the q8_0 kernel's on that block, bit for bit, and needs no offset term
 * whose rounding would stand next to a large dot). */
QD_INLINE size_t qd_q8_bytes(const int q5) { return q5 ? LOOM_GGUF_Q5_0_BYTES : LOOM_GGUF_Q8_0_BYTES; }

QD_INLINE __m256i qd_q8_codes(const uint8_t *blk, const int q5) {
    if (!q5) return qd_load(blk + 2);
    const __m256i u =
        _mm256_or_si256(qd_nibbles16(blk + LOOM_GGUF_Q5_0_QS), qd_q5_0_bits(blk + LOOM_GGUF_Q5_0_QH));
    return _mm256_sub_epi8(u, _mm256_set1_epi8(16));
}

/* One block b of a q4_0 / q4_1 row against MR tokens: acc[t] +=
 * (d dx) (w . x), off[t] += offset * s (the offset times the block's sum
 * of x). */
QD_INLINE void qd_q4_block(const uint8_t *blk, int64_t b, const loom_cpu_q8 *const *xt,
                           const int MR, const int kind, __m256 *acc, __m128 *off) {
    const __m128 dm = qd_q4_dm(blk, kind);
    const __m128 m = _mm_movehdup_ps(dm);
    const __m256i w = qd_q4_codes(blk, kind);
    for (int t = 0; t < MR; t++) {
        const __m256 p = _mm256_cvtepi32_ps(qd_dot(w, qd_load(xt[t]->q + 32 * b)));
        const __m128 ddx = _mm_mul_ss(dm, _mm_load_ss(xt[t]->d + b));
        acc[t] = _mm256_fmadd_ps(p, _mm256_broadcastss_ps(ddx), acc[t]);
        off[t] = _mm_fmadd_ss(m, _mm_load_ss(xt[t]->s + b), off[t]);
    }
}

/* q4_0 / q4_1 rows: one accumulator (and one offset sum) per
 * token, blocks in order. At batch 1 the independent FMA chains come from
 * rows instead (qd_q4_rows), which repeat this arithmetic per row exactly. */
QD_INLINE void qd_q4(const uint8_t *row, int64_t K, const loom_cpu_q8 *x, const int MR, int mr,
                     float *out, const int kind) {
    const size_t bb = qd_q4_bytes(kind);
    __m256 acc[LOOM_CPU_Q8_MR];
    __m128 off[LOOM_CPU_Q8_MR];
    const loom_cpu_q8 *xt[LOOM_CPU_Q8_MR];
    for (int t = 0; t < MR; t++) {
        acc[t] = _mm256_setzero_ps();
        off[t] = _mm_setzero_ps();
        xt[t] = &x[t < mr ? t : 0];
    }
    for (int64_t b = 0; b < K / 32; b++) qd_q4_block(row + (size_t)b * bb, b, xt, MR, kind, acc, off);
    for (int t = 0; t < mr; t++) out[t] = qd_hsum(acc[t]) + _mm_cvtss_f32(off[t]);
}

QD_INLINE void qd_q8_0_block(const uint8_t *blk, int64_t b, const loom_cpu_q8 *const *xt,
                             const int MR, __m256 *acc, const int q5) {
    const __m128 d = _mm_set_ss(qd_f16(blk));
    const __m256i w = qd_q8_codes(blk, q5);
    for (int t = 0; t < MR; t++) {
        const __m256 p = _mm256_cvtepi32_ps(qd_dot_ss(w, qd_load(xt[t]->q + 32 * b)));
        const __m128 ddx = _mm_mul_ss(d, _mm_load_ss(xt[t]->d + b));
        acc[t] = _mm256_fmadd_ps(p, _mm256_broadcastss_ps(ddx), acc[t]);
    }
}

/* q8_0 / q5_0 rows; one accumulator per token as in qd_q4. */
QD_INLINE void qd_q8_0(const uint8_t *row, int64_t K, const loom_cpu_q8 *x, const int MR, int mr,
                       float *out, const int q5) {
    __m256 acc[LOOM_CPU_Q8_MR];
    const loom_cpu_q8 *xt[LOOM_CPU_Q8_MR];
    for (int t = 0; t < MR; t++) {
        acc[t] = _mm256_setzero_ps();
        xt[t] = &x[t < mr ? t : 0];
    }
    for (int64_t b = 0; b < K / 32; b++)
        qd_q8_0_block(row + (size_t)b * qd_q8_bytes(q5), b, xt, MR, acc, q5);
    for (int t = 0; t < mr; t++) out[t] = qd_hsum(acc[t]);
}

/* q4_k (q5 = 0) and q5_k (q5 = 1): 8 sub-blocks of 32 a super-block, each
 * w = (d sc) q - dmin mn; sub-blocks 2i and 2i + 1 are the low and high
 * nibbles of the same 32 bytes, and each lines up with one activation
 * block. q5_k adds bit 4 of sub-block j's codes from bit j of qh[l]; its
 * codes stay unsigned (0..31), so the unsigned x signed dot takes them as
 * they are. */
QD_INLINE void qd_qk(const uint8_t *row, int64_t K, const loom_cpu_q8 *x, const int MR, int mr,
                     float *out, const int q5) {
    __m256 acc[LOOM_CPU_Q8_MR], acc1[LOOM_CPU_Q8_MR];
    float off[LOOM_CPU_Q8_MR];
    const loom_cpu_q8 *xt[LOOM_CPU_Q8_MR];
    for (int t = 0; t < MR; t++) {
        acc[t] = acc1[t] = _mm256_setzero_ps();
        off[t] = 0.0f;
        xt[t] = &x[t < mr ? t : 0];
    }
    const size_t bb = q5 ? LOOM_GGUF_Q5_K_BYTES : LOOM_GGUF_Q4_K_BYTES;
    for (int64_t sb = 0; sb < K / 256; sb++) {
        const uint8_t *blk = row + (size_t)sb * bb;
        float a[8], c[8];
        qd_qk_scales(blk, a, c);
        const __m256i qh = q5 ? qd_load(blk + LOOM_GGUF_Q5_K_QH) : _mm256_setzero_si256();
#pragma GCC unroll 4
        for (int i = 0; i < 4; i++) {
            __m256i lo, hi;
            qd_qk_codes(blk, i, qh, q5, &lo, &hi);
            const int64_t xb = 8 * sb + 2 * i;
            for (int t = 0; t < MR; t++) {
                const loom_cpu_q8 *v = xt[t];
                const __m256 p0 = _mm256_cvtepi32_ps(qd_dot(lo, qd_load(v->q + 32 * xb)));
                const __m256 p1 = _mm256_cvtepi32_ps(qd_dot(hi, qd_load(v->q + 32 * xb + 32)));
                acc[t] = _mm256_fmadd_ps(p0, _mm256_set1_ps(a[2 * i] * v->d[xb]), acc[t]);
                acc1[t] = _mm256_fmadd_ps(p1, _mm256_set1_ps(a[2 * i + 1] * v->d[xb + 1]), acc1[t]);
                /* explicit FMAs: contraction left to the compiler could differ from
                 * the group kernel's vector form */
                off[t] = fmaf(c[2 * i + 1], v->s[xb + 1], fmaf(c[2 * i], v->s[xb], off[t]));
            }
        }
    }
    for (int t = 0; t < mr; t++) out[t] = qd_hsum(_mm256_add_ps(acc[t], acc1[t])) - off[t];
}

/* Sub-block g of a q6_k super-block as signed codes q - 32, and its two
 * scales d sc (lanes 0..3: the first 16 weights, 4..7: the second). */
QD_INLINE __m256i qd_q6_k_codes(const uint8_t *blk, const loom_q6k_sub g) {
    return _mm256_sub_epi8(qd_q6_k_ucodes(blk, g), _mm256_set1_epi8(32));
}

QD_INLINE __m256 qd_q6_k_scale(const uint8_t *blk, const loom_q6k_sub g, const float d) {
    return _mm256_set_m128(_mm_set1_ps(d * (float)(int8_t)blk[g.sc + 1]), _mm_set1_ps(d * (float)(int8_t)blk[g.sc]));
}

/* q6_k: 8 sub-blocks of 32 (loom_q6k_sub_at), codes q - 32 in [-32, 31],
 * one int8 scale per 16 weights: int32 lanes 0..3 are the first 16, lanes
 * 4..7 the second, so one float vector carries both scales. */
QD_INLINE void qd_q6_k(const uint8_t *row, int64_t K, const loom_cpu_q8 *x, const int MR, int mr,
                       float *out) {
    __m256 acc[2][LOOM_CPU_Q8_MR];
    const loom_cpu_q8 *xt[LOOM_CPU_Q8_MR];
    for (int t = 0; t < MR; t++) {
        acc[0][t] = acc[1][t] = _mm256_setzero_ps();
        xt[t] = &x[t < mr ? t : 0];
    }
    for (int64_t sb = 0; sb < K / 256; sb++) {
        const uint8_t *blk = row + (size_t)sb * LOOM_GGUF_Q6_K_BYTES;
        const float d = qd_f16(blk + LOOM_GGUF_Q6_K_D);
#pragma GCC unroll 8
        for (int s = 0; s < 8; s++) {
            /* unrolled: the sub-block's places and shifts are constants */
            const loom_q6k_sub g = loom_q6k_sub_at(s);
            const __m256i w = qd_q6_k_codes(blk, g);
            const __m256 sc = qd_q6_k_scale(blk, g, d);
            const int64_t xb = 8 * sb + s;
            for (int t = 0; t < MR; t++) {
                const loom_cpu_q8 *v = xt[t];
                const __m256 p = _mm256_cvtepi32_ps(qd_dot_ss(w, qd_load(v->q + 32 * xb)));
                acc[s & 1][t] = _mm256_fmadd_ps(p, _mm256_mul_ps(sc, _mm256_set1_ps(v->d[xb])), acc[s & 1][t]);
            }
        }
    }
    for (int t = 0; t < mr; t++) out[t] = qd_hsum(_mm256_add_ps(acc[0][t], acc[1][t]));
}

/* R rows (2 or 4, a constant after inlining) at `stride` bytes apart, one
 * token: qd_q4 at one token for each row, interleaved block by block so the
 * rows share the activation loads and their R FMA chains overlap. Each row
 * sees the same operations in the same order as in qd_q4, so its result is
 * bit for bit the row kernel's (a token's result must not depend on the
 * batch it is in). Four rows were ~5-10% faster than two a block on
 * SmolLM2's q4_1 rows (dev machine, one core). */
QD_INLINE void qd_q4_rows(const uint8_t *r0, size_t stride, const int R, int64_t K,
                          const loom_cpu_q8 *x, float *out, const int kind) {
    const size_t bb = qd_q4_bytes(kind);
    const loom_cpu_q8 *xt[1] = {x};
    __m256 a[4];
    __m128 o[4];
    for (int r = 0; r < R; r++) a[r] = _mm256_setzero_ps(), o[r] = _mm_setzero_ps();
    for (int64_t b = 0; b < K / 32; b++)
        for (int r = 0; r < R; r++)
            qd_q4_block(r0 + (size_t)r * stride + (size_t)b * bb, b, xt, 1, kind, &a[r], &o[r]);
    for (int r = 0; r < R; r++) out[r] = qd_hsum(a[r]) + _mm_cvtss_f32(o[r]);
}

/* R q8_0 / q5_0 rows, one token, as qd_q4_rows. */
QD_INLINE void qd_q8_0_rows(const uint8_t *r0, size_t stride, const int R, int64_t K,
                            const loom_cpu_q8 *x, float *out, const int q5) {
    const loom_cpu_q8 *xt[1] = {x};
    __m256 a[4];
    for (int r = 0; r < R; r++) a[r] = _mm256_setzero_ps();
    for (int64_t b = 0; b < K / 32; b++)
        for (int r = 0; r < R; r++)
            qd_q8_0_block(r0 + (size_t)r * stride + (size_t)b * qd_q8_bytes(q5), b, xt, 1, &a[r], q5);
    for (int r = 0; r < R; r++) out[r] = qd_hsum(a[r]);
}

static void qd_pair_q4_0(const uint8_t *r0, const uint8_t *r1, int64_t K, const loom_cpu_q8 *x,
                         float *out) {
    qd_q4_rows(r0, (size_t)(r1 - r0), 2, K, x, out, QD_KIND_Q4_0);
}

static void qd_pair_q4_1(const uint8_t *r0, const uint8_t *r1, int64_t K, const loom_cpu_q8 *x,
                         float *out) {
    qd_q4_rows(r0, (size_t)(r1 - r0), 2, K, x, out, QD_KIND_Q4_1);
}

static void qd_pair_q5_0(const uint8_t *r0, const uint8_t *r1, int64_t K, const loom_cpu_q8 *x,
                         float *out) {
    qd_q8_0_rows(r0, (size_t)(r1 - r0), 2, K, x, out, 1);
}

static void qd_pair_q8_0(const uint8_t *r0, const uint8_t *r1, int64_t K, const loom_cpu_q8 *x,
                         float *out) {
    qd_q8_0_rows(r0, (size_t)(r1 - r0), 2, K, x, out, 0);
}

static void qd_quad_q4_0(const uint8_t *r0, size_t stride, int64_t K, const loom_cpu_q8 *x,
                         float *out) {
    qd_q4_rows(r0, stride, 4, K, x, out, QD_KIND_Q4_0);
}

static void qd_quad_q4_1(const uint8_t *r0, size_t stride, int64_t K, const loom_cpu_q8 *x,
                         float *out) {
    qd_q4_rows(r0, stride, 4, K, x, out, QD_KIND_Q4_1);
}

static void qd_quad_q5_0(const uint8_t *r0, size_t stride, int64_t K, const loom_cpu_q8 *x,
                         float *out) {
    qd_q8_0_rows(r0, stride, 4, K, x, out, 1);
}

static void qd_quad_q8_0(const uint8_t *r0, size_t stride, int64_t K, const loom_cpu_q8 *x,
                         float *out) {
    qd_q8_0_rows(r0, stride, 4, K, x, out, 0);
}

/* The activation quantizer of q8dot.h, 32 floats a block: max |x| and
 * rint(x * (127 / max)) in float32 as the portable loop computes them (one
 * rounding each, round-to-nearest-even), so the codes, scales and sums are
 * bit for bit the portable ones whatever the instruction set. */
void QD_QUANTIZE(const float *x, int64_t K, void *buf, loom_cpu_q8 *out) {
    const int64_t nb = K / LOOM_CPU_Q8_BLOCK;
    int8_t *q = buf;
    float *d = (float *)(q + K), *s = d + nb;
    int32_t *n = (int32_t *)(s + nb), *halves = n + nb;
    const __m256 sign = _mm256_set1_ps(-0.0f);
    for (int64_t b = 0; b < nb; b++) {
        __m256 v[4], m = _mm256_setzero_ps();
        for (int i = 0; i < 4; i++) {
            v[i] = _mm256_loadu_ps(x + 32 * b + 8 * i);
            m = _mm256_max_ps(m, _mm256_andnot_ps(sign, v[i]));
        }
        __m128 h = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps(m, 1));
        h = _mm_max_ps(h, _mm_movehl_ps(h, h));
        h = _mm_max_ss(h, _mm_movehdup_ps(h));
        const float amax = _mm_cvtss_f32(h);
        const float db = amax / 127.0f, inv = amax > 0.0f ? 127.0f / amax : 0.0f;
        __m256i c[4];
        for (int i = 0; i < 4; i++)
            c[i] = _mm256_cvtps_epi32(_mm256_round_ps(_mm256_mul_ps(v[i], _mm256_set1_ps(inv)),
                                                      _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
        /* int32 -> int8 in element order: packs interleave the 128-bit
         * halves, the permute puts them back */
        const __m256i w16 = _mm256_packs_epi32(c[0], c[1]), x16 = _mm256_packs_epi32(c[2], c[3]);
        const __m256i b8 = _mm256_permutevar8x32_epi32(_mm256_packs_epi16(w16, x16),
                                                       _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
        _mm256_storeu_si256((__m256i *)(q + 32 * b), b8);
        for (int hf = 0; hf < 2; hf++) { /* codes 16 hf .. 16 hf + 15 */
            const __m256i sum = _mm256_add_epi32(c[2 * hf], c[2 * hf + 1]);
            __m128i s4 = _mm_add_epi32(_mm256_castsi256_si128(sum), _mm256_extracti128_si256(sum, 1));
            s4 = _mm_add_epi32(s4, _mm_shuffle_epi32(s4, 0x4E));
            s4 = _mm_add_epi32(s4, _mm_shuffle_epi32(s4, 0xB1));
            halves[2 * b + hf] = _mm_cvtsi128_si32(s4);
        }
        d[b] = db;
        n[b] = halves[2 * b] + halves[2 * b + 1];
        s[b] = db * (float)n[b];
    }
    *out = (loom_cpu_q8){.q = q, .d = d, .s = s, .n = n, .h = halves};
}

/* One function per type: a token count of 1 gets its own copy (decode). */
#define QD_ENTRY(name, body)                                                                      \
    static void name(const uint8_t *row, int64_t K, const loom_cpu_q8 *x, int mr, float *out) {    \
        if (mr == 1) body(row, K, x, 1, 1, out);                                                  \
        else body(row, K, x, LOOM_CPU_Q8_MR, mr, out);                                            \
    }
#define QD_Q4_0(r, K, x, MR, mr, o) qd_q4(r, K, x, MR, mr, o, QD_KIND_Q4_0)
#define QD_Q4_1(r, K, x, MR, mr, o) qd_q4(r, K, x, MR, mr, o, QD_KIND_Q4_1)
#define QD_Q5_0(r, K, x, MR, mr, o) qd_q8_0(r, K, x, MR, mr, o, 1)
#define QD_Q8_0(r, K, x, MR, mr, o) qd_q8_0(r, K, x, MR, mr, o, 0)
QD_ENTRY(qd_row_q4_0, QD_Q4_0)
QD_ENTRY(qd_row_q4_1, QD_Q4_1)
QD_ENTRY(qd_row_q5_0, QD_Q5_0)
#define QD_Q4_K(r, K, x, MR, mr, o) qd_qk(r, K, x, MR, mr, o, 0)
#define QD_Q5_K(r, K, x, MR, mr, o) qd_qk(r, K, x, MR, mr, o, 1)
QD_ENTRY(qd_row_q8_0, QD_Q8_0)
QD_ENTRY(qd_row_q4_k, QD_Q4_K)
QD_ENTRY(qd_row_q5_k, QD_Q5_K)
QD_ENTRY(qd_row_q6_k, qd_q6_k)

loom_cpu_q8dot_fn *const QD_TABLE[LOOM_CPU_Q8_NKINDS] = {
    [LOOM_CPU_Q8_Q4_0] = qd_row_q4_0, [LOOM_CPU_Q8_Q4_1] = qd_row_q4_1,
    [LOOM_CPU_Q8_Q8_0] = qd_row_q8_0, [LOOM_CPU_Q8_Q4_K] = qd_row_q4_k,
    [LOOM_CPU_Q8_Q6_K] = qd_row_q6_k, [LOOM_CPU_Q8_Q5_K] = qd_row_q5_k,
    [LOOM_CPU_Q8_Q5_0] = qd_row_q5_0};

/* The super-block types' rows already hold 8 FMAs a block: two (four) row
 * calls. */
#define QD_KQUANT_ROWS(pair, quad, row)                                                           \
    static void pair(const uint8_t *r0, const uint8_t *r1, int64_t K, const loom_cpu_q8 *x,       \
                     float *out) {                                                                \
        row(r0, K, x, 1, out);                                                                    \
        row(r1, K, x, 1, out + 1);                                                                \
    }                                                                                             \
    static void quad(const uint8_t *r0, size_t stride, int64_t K, const loom_cpu_q8 *x,           \
                     float *out) {                                                                \
        for (int r = 0; r < 4; r++) row(r0 + (size_t)r * stride, K, x, 1, out + r);               \
    }
QD_KQUANT_ROWS(qd_pair_q4_k, qd_quad_q4_k, qd_row_q4_k)
QD_KQUANT_ROWS(qd_pair_q5_k, qd_quad_q5_k, qd_row_q5_k)
QD_KQUANT_ROWS(qd_pair_q6_k, qd_quad_q6_k, qd_row_q6_k)

loom_cpu_q8dot2_fn *const QD_TABLE2[LOOM_CPU_Q8_NKINDS] = {
    [LOOM_CPU_Q8_Q4_0] = qd_pair_q4_0, [LOOM_CPU_Q8_Q4_1] = qd_pair_q4_1,
    [LOOM_CPU_Q8_Q8_0] = qd_pair_q8_0, [LOOM_CPU_Q8_Q4_K] = qd_pair_q4_k,
    [LOOM_CPU_Q8_Q6_K] = qd_pair_q6_k, [LOOM_CPU_Q8_Q5_K] = qd_pair_q5_k,
    [LOOM_CPU_Q8_Q5_0] = qd_pair_q5_0};

loom_cpu_q8dot4_fn *const QD_TABLE4[LOOM_CPU_Q8_NKINDS] = {
    [LOOM_CPU_Q8_Q4_0] = qd_quad_q4_0, [LOOM_CPU_Q8_Q4_1] = qd_quad_q4_1,
    [LOOM_CPU_Q8_Q8_0] = qd_quad_q8_0, [LOOM_CPU_Q8_Q4_K] = qd_quad_q4_k,
    [LOOM_CPU_Q8_Q6_K] = qd_quad_q6_k, [LOOM_CPU_Q8_Q5_K] = qd_quad_q5_k,
    [LOOM_CPU_Q8_Q5_0] = qd_quad_q5_0};

/* ------------------------------------------------ small batches (q8g) */

/* One q4_0 / q4_1 row against MR (4 or 8) tokens of a q8g group: per
 * token exactly qd_q4's operations in qd_q4's order (the products d dx of
 * all tokens in one multiply, the offset sums of all tokens in one FMA,
 * lane t doing what the row kernel's scalar does), so every token's result
 * is the row kernel's bit for bit. What the interleaved group saves: one
 * pointer for every token's codes and scales, and per block one unpack of
 * the weights, one scale product and one offset FMA for all tokens. */
QD_INLINE void qd_q4_g(const uint8_t *row, int64_t K, const loom_cpu_q8g *x, const int MR, float *out,
                       const int kind) {
    const size_t bb = qd_q4_bytes(kind);
    __m256 acc[LOOM_CPU_Q8_G];
    __m256 off8 = _mm256_setzero_ps();
    __m128 off4 = _mm_setzero_ps();
    for (int t = 0; t < MR; t++) acc[t] = _mm256_setzero_ps();
    for (int64_t b = 0; b < K / 32; b++) {
        const uint8_t *blk = row + (size_t)b * bb;
        const __m128 dm = qd_q4_dm(blk, kind);
        const __m256i w = qd_q4_codes(blk, kind);
        const int8_t *xq = x->q + b * (32 * LOOM_CPU_Q8_G);
        const float *xd = x->d + b * LOOM_CPU_Q8_G, *xs = x->s + b * LOOM_CPU_Q8_G;
        float dd[LOOM_CPU_Q8_G];
        if (MR == 8) {
            _mm256_storeu_ps(dd, _mm256_mul_ps(_mm256_broadcastss_ps(dm), _mm256_loadu_ps(xd)));
            off8 = _mm256_fmadd_ps(_mm256_broadcastss_ps(_mm_movehdup_ps(dm)), _mm256_loadu_ps(xs), off8);
        } else {
            _mm_storeu_ps(dd, _mm_mul_ps(_mm_broadcastss_ps(dm), _mm_loadu_ps(xd)));
            off4 = _mm_fmadd_ps(_mm_broadcastss_ps(_mm_movehdup_ps(dm)), _mm_loadu_ps(xs), off4);
        }
        for (int t = 0; t < MR; t++) {
            const __m256 p = _mm256_cvtepi32_ps(qd_dot(w, qd_load(xq + 32 * t)));
            acc[t] = _mm256_fmadd_ps(p, _mm256_set1_ps(dd[t]), acc[t]);
        }
    }
    float o[LOOM_CPU_Q8_G];
    if (MR == 8) _mm256_storeu_ps(o, off8);
    else _mm_storeu_ps(o, off4);
    for (int t = 0; t < MR; t++) out[t] = qd_hsum(acc[t]) + o[t];
}

/* One q8_0 / q5_0 row against MR tokens of a q8g group: qd_q8_0's
 * operations per token, as qd_q4_g. */
QD_INLINE void qd_q8_0_g(const uint8_t *row, int64_t K, const loom_cpu_q8g *x, const int MR, float *out,
                         const int q5) {
    __m256 acc[LOOM_CPU_Q8_G];
    for (int t = 0; t < MR; t++) acc[t] = _mm256_setzero_ps();
    for (int64_t b = 0; b < K / 32; b++) {
        const uint8_t *blk = row + (size_t)b * qd_q8_bytes(q5);
        const __m256i w = qd_q8_codes(blk, q5);
        const __m256i wa = _mm256_sign_epi8(w, w);
        const int8_t *xq = x->q + b * (32 * LOOM_CPU_Q8_G);
        const float *xd = x->d + b * LOOM_CPU_Q8_G;
        float dd[LOOM_CPU_Q8_G];
        if (MR == 8) _mm256_storeu_ps(dd, _mm256_mul_ps(_mm256_set1_ps(qd_f16(blk)), _mm256_loadu_ps(xd)));
        else _mm_storeu_ps(dd, _mm_mul_ps(_mm_set1_ps(qd_f16(blk)), _mm_loadu_ps(xd)));
        for (int t = 0; t < MR; t++) {
            const __m256i xs = _mm256_sign_epi8(qd_load(xq + 32 * t), w);
            const __m256 p = _mm256_cvtepi32_ps(qd_dot(wa, xs));
            acc[t] = _mm256_fmadd_ps(p, _mm256_set1_ps(dd[t]), acc[t]);
        }
    }
    for (int t = 0; t < MR; t++) out[t] = qd_hsum(acc[t]);
}

/* Tokens a k-quant group pass holds: eight need 16 accumulators (two a
 * token), which fit AVX-512's 32 registers; AVX2's 16 take two passes of
 * four. */
#if QD_AVX512
#define QD_KG 8
#else
#define QD_KG 4
#endif

/* One q4_k (q5 = 0) / q5_k (q5 = 1) row against MR (4 or 8) tokens of a
 * q8g group from token t0: per token exactly qd_qk's operations in qd_qk's
 * order (the scale products of all tokens for a sub-block in one multiply,
 * the offset sums in two FMAs, lane t doing what the row kernel's scalars
 * do), so every result is the row kernel's bit for bit; the weights are
 * unpacked once for all MR tokens. */
QD_INLINE void qd_qk_g(const uint8_t *row, int64_t K, const loom_cpu_q8g *x, const int t0, const int MR,
                       float *out, const int q5) {
    enum { G = LOOM_CPU_Q8_G };
    __m256 acc[G], acc1[G];
    __m256 off8 = _mm256_setzero_ps();
    __m128 off4 = _mm_setzero_ps();
    for (int t = 0; t < MR; t++) acc[t] = acc1[t] = _mm256_setzero_ps();
    const size_t bb = q5 ? LOOM_GGUF_Q5_K_BYTES : LOOM_GGUF_Q4_K_BYTES;
    for (int64_t sb = 0; sb < K / 256; sb++) {
        const uint8_t *blk = row + (size_t)sb * bb;
        float a[8], c[8];
        qd_qk_scales(blk, a, c);
        const __m256i qh = q5 ? qd_load(blk + LOOM_GGUF_Q5_K_QH) : _mm256_setzero_si256();
#pragma GCC unroll 4
        for (int i = 0; i < 4; i++) {
            __m256i lo, hi;
            qd_qk_codes(blk, i, qh, q5, &lo, &hi);
            const int64_t xb = 8 * sb + 2 * i;
            const int8_t *q0 = x->q + (xb * G + t0) * 32, *q1 = q0 + G * 32;
            const float *d0 = x->d + xb * G + t0, *s0 = x->s + xb * G + t0;
            float dd0[G], dd1[G];
            if (MR == 8) {
                _mm256_storeu_ps(dd0, _mm256_mul_ps(_mm256_set1_ps(a[2 * i]), _mm256_loadu_ps(d0)));
                _mm256_storeu_ps(dd1, _mm256_mul_ps(_mm256_set1_ps(a[2 * i + 1]), _mm256_loadu_ps(d0 + G)));
                off8 = _mm256_fmadd_ps(_mm256_set1_ps(c[2 * i]), _mm256_loadu_ps(s0), off8);
                off8 = _mm256_fmadd_ps(_mm256_set1_ps(c[2 * i + 1]), _mm256_loadu_ps(s0 + G), off8);
            } else {
                _mm_storeu_ps(dd0, _mm_mul_ps(_mm_set1_ps(a[2 * i]), _mm_loadu_ps(d0)));
                _mm_storeu_ps(dd1, _mm_mul_ps(_mm_set1_ps(a[2 * i + 1]), _mm_loadu_ps(d0 + G)));
                off4 = _mm_fmadd_ps(_mm_set1_ps(c[2 * i]), _mm_loadu_ps(s0), off4);
                off4 = _mm_fmadd_ps(_mm_set1_ps(c[2 * i + 1]), _mm_loadu_ps(s0 + G), off4);
            }
            for (int t = 0; t < MR; t++) {
                const __m256 p0 = _mm256_cvtepi32_ps(qd_dot(lo, qd_load(q0 + 32 * t)));
                const __m256 p1 = _mm256_cvtepi32_ps(qd_dot(hi, qd_load(q1 + 32 * t)));
                acc[t] = _mm256_fmadd_ps(p0, _mm256_set1_ps(dd0[t]), acc[t]);
                acc1[t] = _mm256_fmadd_ps(p1, _mm256_set1_ps(dd1[t]), acc1[t]);
            }
        }
    }
    float o[G];
    if (MR == 8) _mm256_storeu_ps(o, off8);
    else _mm_storeu_ps(o, off4);
    for (int t = 0; t < MR; t++) out[t] = qd_hsum(_mm256_add_ps(acc[t], acc1[t])) - o[t];
}

/* One q6_k row against MR tokens of a group from token t0: qd_q6_k's
 * operations per token, as qd_qk_g. */
QD_INLINE void qd_q6_k_g(const uint8_t *row, int64_t K, const loom_cpu_q8g *x, const int t0, const int MR,
                         float *out) {
    enum { G = LOOM_CPU_Q8_G };
    __m256 acc[2][G];
    for (int t = 0; t < MR; t++) acc[0][t] = acc[1][t] = _mm256_setzero_ps();
    for (int64_t sb = 0; sb < K / 256; sb++) {
        const uint8_t *blk = row + (size_t)sb * LOOM_GGUF_Q6_K_BYTES;
        const float d = qd_f16(blk + LOOM_GGUF_Q6_K_D);
#pragma GCC unroll 8
        for (int s = 0; s < 8; s++) {
            const loom_q6k_sub g = loom_q6k_sub_at(s);
            const __m256i w = qd_q6_k_codes(blk, g);
            const __m256i wa = _mm256_sign_epi8(w, w);
            const __m256 sc = qd_q6_k_scale(blk, g, d);
            const int64_t xb = 8 * sb + s;
            const int8_t *q0 = x->q + (xb * G + t0) * 32;
            const float *d0 = x->d + xb * G + t0;
            for (int t = 0; t < MR; t++) {
                const __m256i xs = _mm256_sign_epi8(qd_load(q0 + 32 * t), w);
                const __m256 p = _mm256_cvtepi32_ps(qd_dot(wa, xs));
                acc[s & 1][t] = _mm256_fmadd_ps(p, _mm256_mul_ps(sc, _mm256_set1_ps(d0[t])), acc[s & 1][t]);
            }
        }
    }
    for (int t = 0; t < MR; t++) out[t] = qd_hsum(_mm256_add_ps(acc[0][t], acc[1][t]));
}

/* nr rows at `stride` bytes against mr (1..8) tokens of a group: four
 * tokens' kernel up to 4, eight's above. */
#define QD_GENTRY(name, body)                                                                     \
    static void name(const uint8_t *r0, size_t stride, int64_t nr, int64_t K,                    \
                     const loom_cpu_q8g *x, int mr, float *out, int64_t ldo) {                    \
        for (int64_t r = 0; r < nr; r++) {                                                        \
            float o[LOOM_CPU_Q8_G];                                                               \
            if (mr <= 4) body(r0 + (size_t)r * stride, K, x, 4, o);                               \
            else body(r0 + (size_t)r * stride, K, x, 8, o);                                       \
            memcpy(out + r * ldo, o, (size_t)mr * sizeof(float));                                 \
        }                                                                                         \
    }
#define QD_Q4_0G(r, K, x, MR, o) qd_q4_g(r, K, x, MR, o, QD_KIND_Q4_0)
#define QD_Q4_1G(r, K, x, MR, o) qd_q4_g(r, K, x, MR, o, QD_KIND_Q4_1)
#define QD_Q5_0G(r, K, x, MR, o) qd_q8_0_g(r, K, x, MR, o, 1)
#define QD_Q8_0G(r, K, x, MR, o) qd_q8_0_g(r, K, x, MR, o, 0)
QD_GENTRY(qd_gemm_q4_0, QD_Q4_0G)
QD_GENTRY(qd_gemm_q4_1, QD_Q4_1G)
QD_GENTRY(qd_gemm_q5_0, QD_Q5_0G)
QD_GENTRY(qd_gemm_q8_0, QD_Q8_0G)

/* The k-quants: passes of QD_KG tokens from token t0. */
#define QD_KGENTRY(name, body)                                                                    \
    static void name(const uint8_t *r0, size_t stride, int64_t nr, int64_t K,                    \
                     const loom_cpu_q8g *x, int mr, float *out, int64_t ldo) {                    \
        for (int64_t r = 0; r < nr; r++) {                                                        \
            const uint8_t *row = r0 + (size_t)r * stride;                                         \
            float o[LOOM_CPU_Q8_G];                                                               \
            if (mr <= 4) body(row, K, x, 0, 4, o);                                                \
            else if (QD_KG == 8) body(row, K, x, 0, 8, o);                                        \
            else body(row, K, x, 0, 4, o), body(row, K, x, 4, 4, o + 4);                          \
            memcpy(out + r * ldo, o, (size_t)mr * sizeof(float));                                 \
        }                                                                                         \
    }
#define QD_Q4_KG(r, K, x, t0, MR, o) qd_qk_g(r, K, x, t0, MR, o, 0)
#define QD_Q5_KG(r, K, x, t0, MR, o) qd_qk_g(r, K, x, t0, MR, o, 1)
QD_KGENTRY(qd_gemm_q4_k, QD_Q4_KG)
QD_KGENTRY(qd_gemm_q5_k, QD_Q5_KG)
QD_KGENTRY(qd_gemm_q6_k, qd_q6_k_g)

loom_cpu_q8gemm_fn *const QD_TABLEG[LOOM_CPU_Q8_NKINDS] = {
    [LOOM_CPU_Q8_Q4_0] = qd_gemm_q4_0, [LOOM_CPU_Q8_Q4_1] = qd_gemm_q4_1,
    [LOOM_CPU_Q8_Q8_0] = qd_gemm_q8_0, [LOOM_CPU_Q8_Q4_K] = qd_gemm_q4_k,
    [LOOM_CPU_Q8_Q6_K] = qd_gemm_q6_k, [LOOM_CPU_Q8_Q5_K] = qd_gemm_q5_k,
    [LOOM_CPU_Q8_Q5_0] = qd_gemm_q5_0};

/* ------------------------------------------------ 16-bit float weights */

/* 8 weights at p as float32: f16 through F16C, bf16 widened and shifted
 * into the top half of each lane. */
QD_INLINE __m256 qd_h8(const uint8_t *p, const int bf) {
    const __m128i h = _mm_loadu_si128((const __m128i *)p);
    if (bf) return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
    return _mm256_cvtph_ps(h);
}

QD_INLINE float qd_h1(const uint8_t *p, const int bf) {
    uint16_t h;
    memcpy(&h, p, 2);
    if (!bf) return _cvtsh_ss(h);
    const uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

/* One 16-bit row against MR tokens: 16 weights a step converted once, two
 * accumulators a token (lanes 0-7 and 8-15), then the K % 16 tail. */
QD_INLINE void qd_hrow(const uint8_t *row, int64_t K, const float *const *x, const int MR, int mr,
                       float *out, const int bf) {
    __m256 a0[LOOM_CPU_Q8_MR], a1[LOOM_CPU_Q8_MR];
    const float *xt[LOOM_CPU_Q8_MR];
    for (int t = 0; t < MR; t++) {
        a0[t] = a1[t] = _mm256_setzero_ps();
        xt[t] = x[t < mr ? t : 0];
    }
    int64_t k = 0;
    for (; k + 16 <= K; k += 16) {
        const __m256 w0 = qd_h8(row + 2 * k, bf), w1 = qd_h8(row + 2 * k + 16, bf);
        for (int t = 0; t < MR; t++) {
            a0[t] = _mm256_fmadd_ps(w0, _mm256_loadu_ps(xt[t] + k), a0[t]);
            a1[t] = _mm256_fmadd_ps(w1, _mm256_loadu_ps(xt[t] + k + 8), a1[t]);
        }
    }
    for (int t = 0; t < mr; t++) {
        float s = qd_hsum(_mm256_add_ps(a0[t], a1[t]));
        for (int64_t i = k; i < K; i++) s += qd_h1(row + 2 * i, bf) * xt[t][i];
        out[t] = s;
    }
}

#define QD_HENTRY(name, bf)                                                                       \
    static void name(const uint8_t *row, int64_t K, const float *const *x, int mr, float *out) {  \
        if (mr == 1) qd_hrow(row, K, x, 1, 1, out, bf);                                           \
        else qd_hrow(row, K, x, LOOM_CPU_Q8_MR, mr, out, bf);                                     \
    }
QD_HENTRY(qd_h_f16, 0)
QD_HENTRY(qd_h_bf16, 1)

loom_cpu_hdot_fn *const QD_HTABLE[2] = {qd_h_f16, qd_h_bf16};
