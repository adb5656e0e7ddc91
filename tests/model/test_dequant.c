/*
 * tests/model/test_dequant.c — 16-bit float conversions and GGML block
 * dequantization.
 *
 * Two independent references per block type: golden vectors produced by the
 * `gguf` Python package (tests/model/gen_dequant.py, llama.cpp's reference
 * implementation), and a float64 re-implementation below written from the
 * format description with per-element index arithmetic (not the loop
 * structure of formats/gguf_blocks.h). Q5_K's and Q5_0's blocks also go
 * through a GGUF file written here and read back by the GGUF reader.
 */
#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../common/fmt_ref.h"
#include "formats/dequant.h"
#include "gguf_writer.h"
#include "model/gguf.h"
#include "formats/gguf_blocks.h"
#include "formats/half.h"

/* ------------------------------------------------------------ helpers */

static void *read_data(const char *name, size_t *len) {
    const char *src = getenv("LOOM_SOURCE_DIR");
    char path[1024];
    snprintf(path, sizeof path, "%s/tests/model/data/%s", src ? src : ".", name);
    FILE *f = fopen(path, "rb");
    cr_assert_not_null(f, "cannot open %s (set LOOM_SOURCE_DIR)", path);
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    rewind(f);
    void *buf = malloc((size_t)n);
    cr_assert_eq(fread(buf, 1, (size_t)n, f), (size_t)n);
    fclose(f);
    *len = (size_t)n;
    return buf;
}

static uint16_t le16(const uint8_t *p) { return (uint16_t)(p[0] | p[1] << 8); }

/* ------------------------------------------------------------ float64 references */

static double ref_q8_0(const uint8_t *row, int64_t e) {
    const uint8_t *b = row + (e / 32) * 34;
    return fr_f16_value(le16(b)) * (double)(int8_t)b[2 + e % 32];
}

static double ref_q4_0(const uint8_t *row, int64_t e) {
    const uint8_t *b = row + (e / 32) * 18;
    int k = (int)(e % 32);
    int q = k < 16 ? (b[2 + k] & 15) : (b[2 + k - 16] >> 4);
    return fr_f16_value(le16(b)) * (q - 8);
}

static double ref_q4_1(const uint8_t *row, int64_t e) {
    const uint8_t *b = row + (e / 32) * 20;
    int k = (int)(e % 32);
    int q = k < 16 ? (b[4 + k] & 15) : (b[4 + k - 16] >> 4);
    return fr_f16_value(le16(b)) * q + fr_f16_value(le16(b + 2));
}

/* Sub-block sb's 6-bit scale and min from the 12 bytes at sc (Q4_K, Q5_K):
 * see ref_q4_k. */
static void ref_k_scale_min(const uint8_t *sc, int sb, int *scale, int *mn) {
    if (sb < 4) {
        *scale = sc[sb] & 63;
        *mn = sc[sb + 4] & 63;
    } else {
        *scale = (sc[sb + 4] & 15) | ((sc[sb - 4] >> 6) << 4);
        *mn = (sc[sb + 4] >> 4) | ((sc[sb] >> 6) << 4);
    }
}

/* Q4_K: 8 sub-blocks of 32 with 6-bit (scale, min) pairs in 12 bytes:
 * bytes 0-3 hold scales 0-3 (low 6 bits) and, in their top 2 bits, bits 4-5
 * of scales 4-7; bytes 4-7 likewise for mins 0-3 / mins 4-7; bytes 8-11 hold
 * the low 4 bits of scale 4+i (low nibble) and min 4+i (high nibble). */
static double ref_q4_k(const uint8_t *row, int64_t e) {
    const uint8_t *b = row + (e / 256) * 144;
    int k = (int)(e % 256);
    int sb = k / 32;                    /* sub-block                          */
    int pair = sb / 2, hi = sb % 2;     /* qs bytes [32*pair, +32), nibble    */
    int scale, mn;
    ref_k_scale_min(b + 4, sb, &scale, &mn);
    uint8_t byte = b[16 + 32 * pair + k % 32];
    int q = hi ? byte >> 4 : byte & 15;
    return fr_f16_value(le16(b)) * scale * q - fr_f16_value(le16(b + 2)) * mn;
}

/* Q6_K: two halves of 128; element r of a half is quarter qq = r/32, l = r%32:
 * low 4 bits from ql[64*half + l + 32*(qq&1)] (low nibble for qq<2, high
 * for qq>=2), high 2 bits from qh[32*half + l] >> (2*qq); scale index
 * 8*half + l/16 + 2*qq; q is offset by -32. */
static double ref_q6_k(const uint8_t *row, int64_t e) {
    const uint8_t *b = row + (e / 256) * 210;
    int k = (int)(e % 256);
    int half = k / 128, r = k % 128, qq = r / 32, l = r % 32;
    uint8_t lo = b[64 * half + l + 32 * (qq & 1)];
    int low4 = qq < 2 ? (lo & 15) : (lo >> 4);
    int high2 = (b[128 + 32 * half + l] >> (2 * qq)) & 3;
    int q = (low4 | high2 << 4) - 32;
    int8_t scale = (int8_t)b[192 + 8 * half + l / 16 + 2 * qq];
    return fr_f16_value(le16(b + 208)) * scale * q;
}

/* Q5_0: 4 bytes qh after d hold bit 4 of element j in bit j (little-endian);
 * the low 4 bits of elements 0..15 are the low nibbles of qs[16], those of
 * 16..31 the high nibbles; q is offset by -16. */
static double ref_q5_0(const uint8_t *row, int64_t e) {
    const uint8_t *b = row + (e / 32) * 22;
    int k = (int)(e % 32);
    int low4 = k < 16 ? (b[6 + k] & 15) : (b[6 + k - 16] >> 4);
    int high = (b[2 + k / 8] >> (k % 8)) & 1;
    return fr_f16_value(le16(b)) * ((low4 | high << 4) - 16);
}

/* Q5_K: Q4_K's d, dmin and 12 scale bytes, then qh[32], then qs[128];
 * element k of sub-block sb (k = 32 sb + l) has Q4_K's 4 low bits (the
 * nibble of qs[32 (sb / 2) + l] that sb's parity picks) and bit 4 from bit
 * sb of qh[l]. */
static double ref_q5_k(const uint8_t *row, int64_t e) {
    const uint8_t *b = row + (e / 256) * 176;
    int k = (int)(e % 256), sb = k / 32, l = k % 32;
    int scale, mn;
    ref_k_scale_min(b + 4, sb, &scale, &mn);
    uint8_t byte = b[48 + 32 * (sb / 2) + l];
    int low4 = sb % 2 ? byte >> 4 : byte & 15;
    int bit4 = (b[16 + l] >> sb) & 1;
    return fr_f16_value(le16(b)) * scale * (low4 | bit4 << 4) - fr_f16_value(le16(b + 2)) * mn;
}

typedef double (*ref_fn)(const uint8_t *, int64_t);

static void check_type(const char *name, loom_dtype t, ref_fn ref) {
    char fn[64];
    size_t rawlen, reflen;
    snprintf(fn, sizeof fn, "%s.raw", name);
    uint8_t *raw = read_data(fn, &rawlen);
    snprintf(fn, sizeof fn, "%s.f32", name);
    float *gold = read_data(fn, &reflen);
    int64_t n = (int64_t)(reflen / 4);
    cr_assert_eq(loom_dtype_row_bytes(t, n), rawlen, "%s: size of golden data", name);
    float *out = malloc((size_t)n * sizeof *out);
    cr_assert_eq(loom_dequant_row(t, raw, out, n), LOOM_OK);
    double maxabs = 0;
    for (int64_t i = 0; i < n; i++) maxabs = fmax(maxabs, fabs(gold[i]));
    cr_assert_gt(maxabs, 0, "%s: golden data is all zero", name);
    for (int64_t i = 0; i < n; i++) {
        double r = ref(raw, i);
        double tol = 1e-6 * (fabs(r) + maxabs * 1e-3);
        cr_assert(fabs(out[i] - gold[i]) <= tol, "%s[%lld]: loom %.9g, gguf-py %.9g", name, (long long)i,
                  (double)out[i], (double)gold[i]);
        cr_assert(fabs(out[i] - r) <= tol, "%s[%lld]: loom %.9g, float64 reference %.9g", name, (long long)i,
                  (double)out[i], r);
    }
    /* unaligned source: same result */
    uint8_t *shifted = malloc(rawlen + 1);
    memcpy(shifted + 1, raw, rawlen);
    float *out2 = malloc((size_t)n * sizeof *out2);
    cr_assert_eq(loom_dequant_row(t, shifted + 1, out2, n), LOOM_OK);
    cr_assert_eq(memcmp(out, out2, (size_t)n * sizeof *out), 0);
    /* partial block */
    if (loom_dtype_block_elems(t) > 1) cr_assert_eq(loom_dequant_row(t, raw, out, n - 1), LOOM_ERR_INVALID);
    free(shifted);
    free(out2);
    free(out);
    free(raw);
    free(gold);
}

Test(model, dequant_q8_0) { check_type("q8_0", LOOM_DTYPE_Q8_0, ref_q8_0); }
Test(model, dequant_q4_0) { check_type("q4_0", LOOM_DTYPE_Q4_0, ref_q4_0); }
Test(model, dequant_q4_1) { check_type("q4_1", LOOM_DTYPE_Q4_1, ref_q4_1); }
Test(model, dequant_q4_k) { check_type("q4_k", LOOM_DTYPE_Q4_K, ref_q4_k); }
Test(model, dequant_q6_k) { check_type("q6_k", LOOM_DTYPE_Q6_K, ref_q6_k); }
Test(model, dequant_q5_k) { check_type("q5_k", LOOM_DTYPE_Q5_K, ref_q5_k); }
Test(model, dequant_q5_0) { check_type("q5_0", LOOM_DTYPE_Q5_0, ref_q5_0); }

/* Q5_0 blocks rewritten as Q8_0 (what the cuda backend uploads: it has no
 * Q5_0 kernel): the widened blocks and the direct decode must both give
 * exactly the values of gguf-py and of the float64 reference (every
 * product is exact). */
Test(model, dequant_q5_0_widened_to_q8_0) {
    size_t rawlen, reflen;
    uint8_t *raw = read_data("q5_0.raw", &rawlen);
    float *gold = read_data("q5_0.f32", &reflen);
    const int64_t n = (int64_t)(reflen / 4), nb = n / LOOM_GGUF_Q5_0_ELEMS;
    cr_assert_eq((size_t)nb * LOOM_GGUF_Q5_0_BYTES, rawlen, "q5_0: size of golden data");
    uint8_t *wide = malloc((size_t)nb * LOOM_GGUF_Q8_0_BYTES);
    float *out = malloc((size_t)n * sizeof *out), direct[32];
    for (int64_t b = 0; b < nb; b++)
        loom_gguf_q5_0_to_q8_0(raw + b * LOOM_GGUF_Q5_0_BYTES, wide + b * LOOM_GGUF_Q8_0_BYTES);
    cr_assert_eq(loom_dequant_row(LOOM_DTYPE_Q8_0, wide, out, n), LOOM_OK);
    double maxabs = 0;
    for (int64_t i = 0; i < n; i++) maxabs = fmax(maxabs, fabs(gold[i]));
    cr_assert_gt(maxabs, 0, "q5_0: golden data is all zero");
    for (int64_t i = 0; i < n; i++) {
        if (i % 32 == 0) loom_gguf_dec_q5_0(raw + (i / 32) * LOOM_GGUF_Q5_0_BYTES, direct);
        cr_assert_eq(out[i], gold[i], "q5_0[%lld]: widened %.9g, gguf-py %.9g", (long long)i, (double)out[i],
                     (double)gold[i]);
        cr_assert_eq(direct[i % 32], gold[i], "q5_0[%lld]: decoded %.9g, gguf-py %.9g", (long long)i,
                     (double)direct[i % 32], (double)gold[i]);
        cr_assert_eq((double)out[i], ref_q5_0(raw, i), "q5_0[%lld]: float64 reference %.9g", (long long)i,
                     ref_q5_0(raw, i));
    }
    free(wide);
    free(out);
    free(raw);
    free(gold);
}

static void check_16bit(const char *name, loom_dtype t) {
    char fn[64];
    size_t rawlen, reflen;
    snprintf(fn, sizeof fn, "%s.raw", name);
    uint16_t *raw = read_data(fn, &rawlen);
    snprintf(fn, sizeof fn, "%s.f32", name);
    float *gold = read_data(fn, &reflen);
    int64_t n = (int64_t)rawlen / 2;
    cr_assert_eq(reflen, (size_t)n * 4);
    float *out = malloc((size_t)n * 4);
    cr_assert_eq(loom_dequant_row(t, raw, out, n), LOOM_OK);
    for (int64_t i = 0; i < n; i++) {
        if (isnan(gold[i])) cr_assert(isnan(out[i]), "%s[%lld] should be NaN", name, (long long)i);
        else cr_assert(memcmp(&out[i], &gold[i], 4) == 0, "%s[%lld]: %g vs %g", name, (long long)i, out[i], gold[i]);
    }
    free(out);
    free(raw);
    free(gold);
}

Test(model, dequant_f16_bf16_f32_int) {
    check_16bit("f16", LOOM_DTYPE_F16);
    check_16bit("bf16", LOOM_DTYPE_BF16);
    float src[5] = {1, -2, 3.5f, 0, 1e30f}, dst[5];
    cr_assert_eq(loom_dequant_row(LOOM_DTYPE_F32, src, dst, 5), LOOM_OK);
    cr_assert_eq(memcmp(src, dst, sizeof src), 0);
    int8_t i8[3] = {-128, 0, 127};
    cr_assert_eq(loom_dequant_row(LOOM_DTYPE_I8, i8, dst, 3), LOOM_OK);
    cr_assert(dst[0] == -128 && dst[2] == 127);
    cr_assert_eq(loom_dequant_row(LOOM_DTYPE_FP8_E4M3, i8, dst, 3), LOOM_ERR_INVALID);
    cr_assert(!loom_dequant_supported(LOOM_DTYPE_U8));
}

/* ------------------------------------------------------------ half.h */

Test(model, half_fp16_exhaustive) {
    for (uint32_t h = 0; h < 65536; h++) {
        float f = loom_fp16_to_fp32((uint16_t)h);
        double r = fr_f16_value((uint16_t)h);
        if (isnan(r)) {
            cr_assert(isnan(f), "%04x", h);
            cr_assert(isnan(loom_fp16_to_fp32(loom_fp32_to_fp16(f))));
            continue;
        }
        cr_assert((double)f == r, "fp16 %04x -> %g, expected %g", h, f, r);
        cr_assert_eq(loom_fp32_to_fp16(f), h, "round trip of %04x", h);
        cr_assert_eq(signbit(f) != 0, (h >> 15) != 0);
    }
}

/* Nearest binary16 to x (float64 reference, ties to even) by searching the
 * ordered positive codes. */
static uint16_t ref_to_fp16(float x) {
    if (isnan(x)) return 0x7e00;
    uint16_t sign = signbit(x) ? 0x8000 : 0;
    double a = fabs((double)x);
    if (a >= 65520.0) return sign | 0x7c00;
    uint32_t lo = 0, hi = 0x7bff; /* largest code with value <= a */
    while (lo < hi) {
        uint32_t mid = (lo + hi + 1) / 2;
        if (fr_f16_value((uint16_t)mid) <= a) lo = mid;
        else hi = mid - 1;
    }
    if (lo == 0x7bff) return sign | 0x7bff;
    double d0 = a - fr_f16_value((uint16_t)lo), d1 = fr_f16_value((uint16_t)(lo + 1)) - a;
    uint16_t r = (uint16_t)(d0 < d1 ? lo : d1 < d0 ? lo + 1 : (lo & 1 ? lo + 1 : lo));
    return sign | r;
}

Test(model, half_fp32_to_fp16_rounding) {
    uint64_t s = 12345;
    for (int i = 0; i < 200000; i++) {
        s = s * 6364136223846793005ull + 1442695040888963407ull;
        uint32_t bits = (uint32_t)(s >> 32);
        /* bias towards the fp16 range: exponents 100..145 */
        if (i % 2) bits = (bits & 0x807fffffu) | ((100u + (bits >> 23) % 46u) << 23);
        float f;
        memcpy(&f, &bits, 4);
        uint16_t got = loom_fp32_to_fp16(f), want = ref_to_fp16(f);
        if (isnan(f)) cr_assert((got & 0x7c00) == 0x7c00 && (got & 0x3ff), "NaN stays NaN");
        else cr_assert_eq(got, want, "fp32 %08x (%g): got %04x want %04x", bits, f, got, want);
    }
    /* exact halfway cases round to even */
    cr_assert_eq(loom_fp32_to_fp16(1.0f + 0x1p-11f), 0x3c00);
    cr_assert_eq(loom_fp32_to_fp16(1.0f + 3 * 0x1p-11f), 0x3c02);
    cr_assert_eq(loom_fp32_to_fp16(0x1p-25f), 0x0000);          /* half of smallest subnormal */
    cr_assert_eq(loom_fp32_to_fp16(0x1.8p-25f), 0x0001);
    cr_assert_eq(loom_fp32_to_fp16(65504.0f), 0x7bff);
    cr_assert_eq(loom_fp32_to_fp16(65519.0f), 0x7bff);
    cr_assert_eq(loom_fp32_to_fp16(65520.0f), 0x7c00);
    cr_assert_eq(loom_fp32_to_fp16(-INFINITY), 0xfc00);
}

Test(model, half_bf16) {
    uint64_t s = 99;
    for (int i = 0; i < 200000; i++) {
        s = s * 6364136223846793005ull + 1442695040888963407ull;
        uint32_t bits = (uint32_t)(s >> 32);
        float f;
        memcpy(&f, &bits, 4);
        uint16_t b = loom_fp32_to_bf16(f);
        if (isnan(f)) {
            cr_assert(isnan(loom_bf16_to_fp32(b)));
            continue;
        }
        /* reference: the two neighbours, nearest wins, ties to even */
        uint32_t lo = bits & 0xffff0000u, rest = bits & 0xffffu;
        uint16_t want = (uint16_t)(lo >> 16);
        if (rest > 0x8000u || (rest == 0x8000u && (want & 1))) want++;
        cr_assert_eq(b, want, "%08x", bits);
    }
    for (uint32_t h = 0; h < 65536; h++) {
        float f = loom_bf16_to_fp32((uint16_t)h);
        if (!isnan(f)) cr_assert_eq(loom_fp32_to_bf16(f), h);
    }
    cr_assert_eq(loom_fp32_to_bf16(3.4e38f), 0x7f80, "overflow rounds to inf");
}

/* A type's gguf-py golden blocks as a 2-D tensor (rows of `cols`) of a
 * GGUF file: the reader maps GGML type `ggml` to loom type t with the bytes
 * as written, and each row dequantizes to gguf-py's values. */
static void check_gguf_reads_back(const char *name, uint32_t ggml, loom_dtype t, int64_t cols) {
    char fn[64];
    size_t rawlen, reflen;
    snprintf(fn, sizeof fn, "%s.raw", name);
    uint8_t *raw = read_data(fn, &rawlen);
    snprintf(fn, sizeof fn, "%s.f32", name);
    float *gold = read_data(fn, &reflen);
    const int64_t n = (int64_t)(reflen / 4), rows = n / cols;
    cr_assert_eq(rows * cols, n, "%s golden data: %lld values are not rows of %lld", name, (long long)n,
                 (long long)cols);
    gb b;
    gb_init(&b);
    gb_s(&b, "general.architecture", "llama");
    uint64_t ne[2] = {(uint64_t)cols, (uint64_t)rows};
    gb_tensor_add(&b, "blk.0.ffn_down.weight", ggml, 2, ne, raw, rawlen);
    gw f = gb_finish(&b);
    loom_gguf *g = NULL;
    loom_error err = {0};
    cr_assert_eq(loom_gguf_open_buffer(f.buf, f.len, "q5.gguf", &g, &err), LOOM_OK, "%s", err.message);
    const loom_gguf_tensor_info *ti = loom_gguf_find_tensor(g, "blk.0.ffn_down.weight");
    cr_assert(ti && ti->supported && ti->dtype == t && ti->ggml_type == ggml);
    cr_assert_str_eq(loom_dtype_name(ti->dtype), name);
    cr_assert_eq(ti->nbytes, rawlen);
    cr_assert_eq(memcmp(ti->data, raw, rawlen), 0);
    float *row = malloc((size_t)cols * sizeof *row);
    for (int64_t r = 0; r < rows; r++) {
        const uint8_t *src = (const uint8_t *)ti->data + (size_t)r * loom_dtype_row_bytes(t, cols);
        cr_assert_eq(loom_dequant_row(t, src, row, cols), LOOM_OK);
        for (int64_t c = 0; c < cols; c++)
            cr_assert_eq(row[c], gold[r * cols + c], "%s row %lld col %lld: %.9g, gguf-py %.9g", name,
                         (long long)r, (long long)c, (double)row[c], (double)gold[r * cols + c]);
    }
    free(row);
    loom_gguf_close(g);
    free(f.buf);
    gb_free(&b);
    free(raw);
    free(gold);
}

Test(model, gguf_q5_k_tensor_reads_back) { check_gguf_reads_back("q5_k", GG_Q5_K, LOOM_DTYPE_Q5_K, 512); }
Test(model, gguf_q5_0_tensor_reads_back) { check_gguf_reads_back("q5_0", GG_Q5_0, LOOM_DTYPE_Q5_0, 64); }
