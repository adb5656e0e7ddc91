/*
 * kernels/cpu/q8dot.h — dot products of GGUF weight rows (q4_0, q4_1, q5_0,
 * q8_0, q4_k, q5_k, q6_k blocks as stored) with activations quantized to 8 bits per
 * block of 32, in integer arithmetic: the batch-1 and small-batch path of
 * kernels/cpu/qlinear.c for GGUF weights.
 *
 * Activations: each token's K floats become K/32 blocks of int8 codes with
 * one float scale each (d = max|x| / 127, q = rint(x / d)), the block's
 * d * sum(q) (the term a weight offset multiplies: q4_1's min, q4_0's -8,
 * q4_k's and q5_k's mins; q5_0 is dotted as the q8_0 block of its values,
 * codes - 16) and sum(q) itself, whole and by halves of 16 (the
 * block-exact kernels' start: below).
 * Weight codes times activation codes accumulate in int32
 * per block (or per 16-weight scale group), and only then meet the float
 * scales. The result differs from the float-activation product by the
 * activation rounding alone: at most d/2 per activation.
 *
 * Instruction sets: AVX2 (maddubs / madd), AVX-512 (the same code with
 * EVEX encodings and 32 registers), AVX-512 VNNI (for every block type the
 * block-exact 16-row tiles, vpdpbusd on 512 bits, whose arithmetic every
 * kernel on that set shares: "tiles" below; its quantizer and 16-bit
 * kernels are AVX-512's), and portable C, each built as its own object and picked once
 * per process from the CPU's features (loom_cpu_q8_isa), or forced by name.
 *
 * Internal to kernels/cpu, its tests, and the cpu backend (its cpu_isa
 * parameter forces an instruction set).
 */
#ifndef LOOM_CPU_Q8DOT_H
#define LOOM_CPU_Q8DOT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "loom/tensor.h"

#define LOOM_CPU_Q8_BLOCK 32   /* activations per scale                       */
#define LOOM_CPU_Q8_MR 4       /* tokens one row call serves                  */

/* One token's quantized activations (borrowed pointers into a buffer). */
typedef struct loom_cpu_q8 {
    const int8_t *q;           /* (K) codes in [-127, 127]                     */
    const float *d;            /* (K/32) block scales                          */
    const float *s;            /* (K/32) d * sum of the block's codes          */
    const int32_t *n;          /* (K/32) sum of the block's codes              */
    const int32_t *h;          /* (K/16) sums of its halves (q6_k's scale groups) */
} loom_cpu_q8;

/* Bytes one token of K activations takes (K a multiple of 32). */
size_t loom_cpu_q8_bytes(int64_t K);

/* Quantize x (K floats) into buf (loom_cpu_q8_bytes(K), 4-byte aligned) and
 * point *out into it. K a multiple of 32. Every instruction set's version
 * gives the same bytes. */
void loom_cpu_q8_quantize(const float *x, int64_t K, void *buf, loom_cpu_q8 *out);

/* out[t] = row . x[t] for t < mr (1..LOOM_CPU_Q8_MR): `row` holds K / elems
 * blocks of `dtype` (as stored); x[t] the token's activations of K. */
typedef void loom_cpu_q8dot_fn(const uint8_t *row, int64_t K, const loom_cpu_q8 *x, int mr,
                               float *out);

/* The row kernel for a GGUF block type on this CPU, or NULL when the type
 * has none (q4_0, q4_1, q5_0, q8_0, q4_k, q5_k and q6_k do). */
loom_cpu_q8dot_fn *loom_cpu_q8dot(loom_dtype dtype);

/* Batch 1, two rows: out[0] = row0 . x, out[1] = row1 . x (x one token),
 * each bit for bit the row kernel's result. One pass over the activations
 * serves both rows, with twice the independent FMA chains: on SmolLM2's
 * short rows (18 blocks) ~20-35% faster than two row calls (on the
 * avx512vnni set the tiled types' pair and quad kernels are
 * row calls: qlinear.c runs those types as tiles). */
typedef void loom_cpu_q8dot2_fn(const uint8_t *row0, const uint8_t *row1, int64_t K,
                                const loom_cpu_q8 *x, float *out);

/* The two-row kernel for `dtype` on this CPU (every type the row kernel
 * serves has one), or NULL. */
loom_cpu_q8dot2_fn *loom_cpu_q8dot2(loom_dtype dtype);

/* Batch 1, four rows at `stride` bytes apart: out[r] = row r . x, each bit
 * for bit the row kernel's result; q4_0 / q4_1 / q5_0 / q8_0 interleave the
 * four rows block by block (the k-quants, and every type on the
 * avx512vnni set, make four row calls). */
typedef void loom_cpu_q8dot4_fn(const uint8_t *row0, size_t stride, int64_t K,
                                const loom_cpu_q8 *x, float *out);

/* The four-row kernel for `dtype` on this CPU (every type the row kernel
 * serves has one), or NULL. */
loom_cpu_q8dot4_fn *loom_cpu_q8dot4(loom_dtype dtype);

/* ---- small batches: up to LOOM_CPU_Q8_G tokens interleaved block by block */

#define LOOM_CPU_Q8_G 8        /* tokens one group holds                      */

/* A group of tokens' activations, interleaved: block b of token t's codes
 * at q + (8 b + t) 32, its scale at d[8 b + t], its d * sum at s[8 b + t]
 * (its code sums at n[8 b + t] and h[2 (8 b + t)]). One pointer reaches
 * every token, and the scales of all the tokens for one block are one
 * vector. Tokens past the group's count
 * repeat token 0 (computed by the kernels, never stored). */
typedef struct loom_cpu_q8g {
    const int8_t *q;           /* (K/32, 8, 32) codes                          */
    const float *d;            /* (K/32, 8) block scales                       */
    const float *s;            /* (K/32, 8) d * sum of the block's codes       */
    const int32_t *n;          /* (K/32, 8) sum of the block's codes           */
    const int32_t *h;          /* (K/32, 8, 2) sums of its halves              */
} loom_cpu_q8g;

/* Bytes one group of K activations takes (K a multiple of 32). */
size_t loom_cpu_q8g_bytes(int64_t K);

/* Interleave mr (1..8) tokens' activations x (loom_cpu_q8_quantize's) into
 * buf (loom_cpu_q8g_bytes(K), 4-byte aligned) and point *out into it. */
void loom_cpu_q8g_pack(const loom_cpu_q8 *x, int mr, int64_t K, void *buf, loom_cpu_q8g *out);

/* out[r * ldo + t] = row r . token t for r < nr, t < mr (1..8): nr rows of
 * `dtype` at `stride` bytes apart against a group. Each result is bit for
 * bit the row kernel's for that row and token (so a token's product does
 * not depend on the batch it is in: decode and a verify step agree). */
typedef void loom_cpu_q8gemm_fn(const uint8_t *row0, size_t stride, int64_t nr, int64_t K,
                                const loom_cpu_q8g *x, int mr, float *out, int64_t ldo);

/* The group kernel for `dtype` on this CPU (every type the row kernel
 * serves has one), or NULL (the portable set). */
loom_cpu_q8gemm_fn *loom_cpu_q8gemm(loom_dtype dtype);

/* 16-bit float weights kept as stored (f16, bf16; K elements of 2 bytes,
 * any K) times float activations: out[t] = row . x[t] for t < mr (1..4),
 * float32 products and sums (no activation rounding: the weights convert
 * exactly). f16 converts with F16C, bf16 by a 16-bit shift; the same
 * instruction sets as above pick them (a token's result is the same at
 * every mr). */
typedef void loom_cpu_hdot_fn(const uint8_t *row, int64_t K, const float *const *x, int mr,
                              float *out);

/* The kernel for LOOM_DTYPE_F16 or LOOM_DTYPE_BF16 on this CPU, or NULL. */
loom_cpu_hdot_fn *loom_cpu_hdot(loom_dtype dtype);

/* ---- tiles of 16 rows on AVX-512 VNNI
 *
 * Every block type (q4_0, q4_1, q5_0, q8_0, q4_k, q5_k, q6_k) on the
 * avx512vnni set is dotted block-exact: per block of 32 (a k-quant's sub-block) the integer dot
 * sum (c - z) q of the codes c, unsigned, with their zero z (q4_0 8, q5_0
 * 16, q8_0's int8 codes as c = w + 128 with z 128, q4_1, q4_k and q5_k
 * 0), exact in int32; then acc = fma(float(dot), d dx, acc) in block
 * order, d dx one float product (q4_k / q5_k: d sc for d); q4_1's offsets
 * m s summed apart the same way and added at the end, q4_k's / q5_k's
 * (dmin mn) s subtracted. q6_k (codes c - 32, an int8 scale a half of 16):
 * the dot is sc0 sum_0 + sc1 sum_1 over the halves, exact in int32, then
 * the same FMA with the super-block's d. Every kernel of those types on that
 * set — row, pair, quad, group and tile — gives these bits, so a token's
 * result does not depend on the batch or the rows around it.
 *
 * Why: with one integer dot a block, 16 rows share each instruction (a
 * row a 32-bit lane, 4 codes of each row a vpdpbusd, the token's 4 codes
 * broadcast), and a block costs ~12 vector instructions per token for 16
 * rows, where the 8-lane form of the other sets costs ~4 per row. The rows
 * are repacked into that layout per call (pack), once for all the tokens
 * of the call. */
#define LOOM_CPU_Q8_TILE 16
#define LOOM_CPU_Q8_TILE_BLOCK 704 /* tile bytes a block of 32 columns */
#define LOOM_CPU_Q8_TILE_MAX_STRIDE ((size_t)1 << 27) /* 16 rows' offsets fit int32 */

typedef struct loom_cpu_q8tile_kernel {
    /* Repack nr (1..16) rows at `stride` (< LOOM_CPU_Q8_TILE_MAX_STRIDE)
     * bytes of K columns into tile (loom_cpu_q8tile_bytes(K)); rows past
     * nr are zero. `next` (or NULL) is the first of the 16 rows, at the
     * same stride, that the caller packs next: their K columns are
     * prefetched meanwhile (a hint; never read). */
    void (*pack)(const uint8_t *row0, size_t stride, int nr, int64_t K, const uint8_t *next,
                 void *tile);
    /* out[16 t + r] = row r . x[t] for t < mr (>= 1), every r < 16 (rows
     * past the tile's nr give 0). */
    void (*dot)(const void *tile, int64_t K, const loom_cpu_q8 *x, int64_t mr, float *out);
} loom_cpu_q8tile_kernel;

/* Bytes one tile of K columns takes. */
size_t loom_cpu_q8tile_bytes(int64_t K);

/* The tile kernel for `dtype` on the current instruction set, or NULL
 * (every set but avx512vnni; a dtype that is no block type above). */
const loom_cpu_q8tile_kernel *loom_cpu_q8tile(loom_dtype dtype);

/* Which instruction set the kernels use here: "avx512vnni", "avx512",
 * "avx2" or "portable". */
const char *loom_cpu_q8_isa(void);

/* The best instruction set this CPU has (what NULL below goes back to). */
const char *loom_cpu_q8_best_isa(void);

/* Force an instruction set by name (tests, and the cpu backend's cpu_isa,
 * so every path this machine has can run); false, leaving the choice as it
 * was, when the CPU lacks it or the name is unknown. NULL goes back to the
 * best one. Process-wide; a product already running finishes on the set it
 * started with (each call reads the choice once). */
bool loom_cpu_q8_force_isa(const char *name);

/* ---- per-ISA tables (q8dot_*.c); index by loom_cpu_q8_kind */
enum { LOOM_CPU_Q8_Q4_0, LOOM_CPU_Q8_Q4_1, LOOM_CPU_Q8_Q8_0, LOOM_CPU_Q8_Q4_K, LOOM_CPU_Q8_Q6_K,
       LOOM_CPU_Q8_Q5_K, LOOM_CPU_Q8_Q5_0, LOOM_CPU_Q8_NKINDS };
extern loom_cpu_q8dot_fn *const loom_cpu_q8dot_portable[LOOM_CPU_Q8_NKINDS];
extern loom_cpu_q8dot_fn *const loom_cpu_q8dot_avx2[LOOM_CPU_Q8_NKINDS];
extern loom_cpu_q8dot2_fn *const loom_cpu_q8dot2_portable[LOOM_CPU_Q8_NKINDS];
extern loom_cpu_q8dot2_fn *const loom_cpu_q8dot2_avx2[LOOM_CPU_Q8_NKINDS];
extern loom_cpu_q8dot_fn *const loom_cpu_q8dot_avx512[LOOM_CPU_Q8_NKINDS];
extern loom_cpu_q8dot4_fn *const loom_cpu_q8dot4_portable[LOOM_CPU_Q8_NKINDS];
extern loom_cpu_q8dot4_fn *const loom_cpu_q8dot4_avx2[LOOM_CPU_Q8_NKINDS];
extern loom_cpu_q8dot4_fn *const loom_cpu_q8dot4_avx512[LOOM_CPU_Q8_NKINDS];
extern loom_cpu_q8dot2_fn *const loom_cpu_q8dot2_avx512[LOOM_CPU_Q8_NKINDS];
extern loom_cpu_q8gemm_fn *const loom_cpu_q8gemm_avx2[LOOM_CPU_Q8_NKINDS];
extern loom_cpu_q8gemm_fn *const loom_cpu_q8gemm_avx512[LOOM_CPU_Q8_NKINDS];
/* the block-exact kernels of the tiled types on a set (q8dot_tile.c:
 * avx512vnni, every block type: that set has no tables of its own) */
typedef struct loom_cpu_q8exact {
    loom_cpu_q8dot_fn *row[LOOM_CPU_Q8_NKINDS];
    loom_cpu_q8dot2_fn *pair[LOOM_CPU_Q8_NKINDS];
    loom_cpu_q8dot4_fn *quad[LOOM_CPU_Q8_NKINDS];
    loom_cpu_q8gemm_fn *group[LOOM_CPU_Q8_NKINDS];
    const loom_cpu_q8tile_kernel *tile[LOOM_CPU_Q8_NKINDS];
} loom_cpu_q8exact;
extern const loom_cpu_q8exact loom_cpu_q8exact_vnni;
/* the 16-bit kernels of each instruction set: [0] f16, [1] bf16 */
extern loom_cpu_hdot_fn *const loom_cpu_hdot_portable[2];
extern loom_cpu_hdot_fn *const loom_cpu_hdot_avx2[2];
extern loom_cpu_hdot_fn *const loom_cpu_hdot_avx512[2];
/* the quantizer of each instruction set (bit for bit the same results) */
void loom_cpu_q8_quantize_portable(const float *x, int64_t K, void *buf, loom_cpu_q8 *out);
void loom_cpu_q8_quantize_avx2(const float *x, int64_t K, void *buf, loom_cpu_q8 *out);
void loom_cpu_q8_quantize_avx512(const float *x, int64_t K, void *buf, loom_cpu_q8 *out);

#endif
