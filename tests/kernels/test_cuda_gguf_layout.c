/*
 * tests/kernels/test_cuda_gguf_layout.c — the host side of the cuda
 * backend's GGUF-as-stored weights (kernels/cuda/gguf_layout.c), which
 * needs no GPU: block geometry against loom/tensor.h, which (type, K) the
 * kernels accept, how a fused group's parts of one or several block types
 * become 16-byte aligned segments, and which tensor-parallel column windows
 * keep whole blocks. A last test lays out random mixed-type groups and
 * copies their rows and windows the way the loader does (cb_upload_gguf: a
 * strided copy per part), then checks every device row is byte for byte the
 * file's row window and that the kernels' reads (up to the next 16-byte
 * boundary of a segment) stay inside the allocation. And q5_0, which the
 * loader rewrites as q8_0 (loom_cuda_q5_0_rows_as_q8_0): every element of
 * a rank's column window keeps its value, nothing outside the window's
 * rows is written, and a window that cuts a block is refused.
 */
#include <criterion/criterion.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "gguf_layout.h"
#include "rng.h"
#include "loom/tensor.h"
#include "formats/dtype.h"
#include "formats/gguf_blocks.h"

static const loom_cuda_gguf all_types[5] = {LOOM_CUDA_GGUF_Q4_0, LOOM_CUDA_GGUF_Q4_1,
                                            LOOM_CUDA_GGUF_Q4_K, LOOM_CUDA_GGUF_Q6_K,
                                            LOOM_CUDA_GGUF_Q8_0};

Test(cuda_gguf_layout, geometry_matches_loom_dtypes) {
    for (int i = 0; i < 5; i++) {
        const loom_cuda_gguf t = all_types[i];
        const loom_dtype d = (loom_dtype)t; /* the values are loom_dtype's */
        cr_assert_eq(loom_cuda_gguf_block_elems(t), loom_dtype_block_elems(d), "%s", loom_dtype_name(d));
        cr_assert_eq((size_t)loom_cuda_gguf_block_bytes(t), loom_dtype_block_bytes(d), "%s",
                     loom_dtype_name(d));
        cr_assert_str_eq(loom_cuda_gguf_name(t), loom_dtype_name(d));
        for (int64_t k = 0; k <= 2048; k += 32)
            cr_assert_eq(loom_cuda_gguf_row_bytes(t, k), loom_dtype_row_bytes(d, k), "%s k=%lld",
                         loom_dtype_name(d), (long long)k);
    }
    /* not GGUF block types: no geometry */
    const int others[6] = {LOOM_DTYPE_F32, LOOM_DTYPE_F16, LOOM_DTYPE_BF16, LOOM_DTYPE_I8,
                           LOOM_DTYPE_U8, 99};
    for (int i = 0; i < 6; i++) {
        cr_assert_eq(loom_cuda_gguf_block_elems((loom_cuda_gguf)others[i]), 0);
        cr_assert_eq(loom_cuda_gguf_row_bytes((loom_cuda_gguf)others[i], 256), 0);
        cr_assert_eq(loom_cuda_gguf_ok((loom_cuda_gguf)others[i], 256), 0);
    }
}

Test(cuda_gguf_layout, ok_needs_whole_blocks) {
    cr_assert(loom_cuda_gguf_ok(LOOM_CUDA_GGUF_Q4_1, 576));  /* SmolLM2 hidden */
    cr_assert(loom_cuda_gguf_ok(LOOM_CUDA_GGUF_Q4_0, 32));
    cr_assert(loom_cuda_gguf_ok(LOOM_CUDA_GGUF_Q4_K, 4096));
    cr_assert(loom_cuda_gguf_ok(LOOM_CUDA_GGUF_Q6_K, 14336));
    cr_assert_not(loom_cuda_gguf_ok(LOOM_CUDA_GGUF_Q4_K, 576)); /* 2.25 super-blocks */
    cr_assert_not(loom_cuda_gguf_ok(LOOM_CUDA_GGUF_Q8_0, 48));
    cr_assert_not(loom_cuda_gguf_ok(LOOM_CUDA_GGUF_Q4_0, 0));
    cr_assert_not(loom_cuda_gguf_ok(LOOM_CUDA_GGUF_Q4_0, -32));
    cr_assert_not(loom_cuda_gguf_ok(LOOM_CUDA_GGUF_Q4_0, (int64_t)1 << 31));
}

Test(cuda_gguf_layout, one_type_is_one_segment) {
    /* SmolLM2's Q/K/V: 576 + 192 + 192 rows of 576 q4_1 columns (360 B) */
    const loom_cuda_gguf ty[3] = {LOOM_CUDA_GGUF_Q4_1, LOOM_CUDA_GGUF_Q4_1, LOOM_CUDA_GGUF_Q4_1};
    const int64_t rows[3] = {576, 192, 192};
    loom_cuda_gguf_layout l;
    char why[200] = "";
    cr_assert(loom_cuda_gguf_plan_group(ty, rows, 3, 576, &l, why, sizeof why), "%s", why);
    const size_t rb = 18 * 20;
    cr_assert_eq(l.nseg, 1);
    cr_assert_eq(l.seg[0].type, LOOM_CUDA_GGUF_Q4_1);
    cr_assert_eq(l.seg[0].rows, 960);
    cr_assert_eq(l.seg[0].offset, 0);
    cr_assert_eq(l.part_offset[0], 0);
    cr_assert_eq(l.part_offset[1], 576 * rb);
    cr_assert_eq(l.part_offset[2], 768 * rb);
    cr_assert_eq(l.bytes, (960 * rb + 15) / 16 * 16);
}

Test(cuda_gguf_layout, type_changes_start_aligned_segments) {
    /* a Q4_K_M-like Q/K/V: q4_k, q4_k, q6_k; and q4_0 | q8_0 | q4_0 */
    const loom_cuda_gguf a[3] = {LOOM_CUDA_GGUF_Q4_K, LOOM_CUDA_GGUF_Q4_K, LOOM_CUDA_GGUF_Q6_K};
    const int64_t ra[3] = {4096, 1024, 1024};
    loom_cuda_gguf_layout l;
    char why[200] = "";
    cr_assert(loom_cuda_gguf_plan_group(a, ra, 3, 4096, &l, why, sizeof why), "%s", why);
    cr_assert_eq(l.nseg, 2);
    cr_assert_eq(l.seg[0].rows, 5120);
    cr_assert_eq(l.seg[1].rows, 1024);
    cr_assert_eq(l.seg[1].type, LOOM_CUDA_GGUF_Q6_K);
    cr_assert_eq(l.part_offset[1], 4096 * (size_t)(16 * 144));
    cr_assert_eq(l.part_offset[2], l.seg[1].offset);
    cr_assert_eq(l.seg[1].offset % 16, 0);
    cr_assert_geq(l.seg[1].offset, 5120 * (size_t)(16 * 144));
    cr_assert_eq(l.bytes, l.seg[1].offset + 1024 * (size_t)(16 * 210));

    const loom_cuda_gguf b[3] = {LOOM_CUDA_GGUF_Q4_0, LOOM_CUDA_GGUF_Q8_0, LOOM_CUDA_GGUF_Q4_0};
    const int64_t rb[3] = {7, 3, 5}; /* odd rows: segment ends off 16 bytes */
    cr_assert(loom_cuda_gguf_plan_group(b, rb, 3, 64, &l, why, sizeof why), "%s", why);
    cr_assert_eq(l.nseg, 3);
    cr_assert_eq(l.seg[1].offset, (7 * 36 + 15) / 16 * 16);
    cr_assert_eq(l.seg[2].offset, (l.seg[1].offset + 3 * 68 + 15) / 16 * 16);
    cr_assert_eq(l.bytes, (l.seg[2].offset + 5 * 36 + 15) / 16 * 16);
}

Test(cuda_gguf_layout, refusals_say_why) {
    loom_cuda_gguf_layout l;
    char why[200] = "";
    const loom_cuda_gguf k4[2] = {LOOM_CUDA_GGUF_Q4_K, LOOM_CUDA_GGUF_Q4_K};
    const int64_t r2[2] = {8, 8};
    cr_assert_not(loom_cuda_gguf_plan_group(k4, r2, 2, 576, &l, why, sizeof why));
    cr_assert(strstr(why, "whole blocks of 256"), "%s", why);
    const loom_cuda_gguf bad[2] = {LOOM_CUDA_GGUF_Q4_0, (loom_cuda_gguf)LOOM_DTYPE_BF16};
    cr_assert_not(loom_cuda_gguf_plan_group(bad, r2, 2, 256, &l, why, sizeof why));
    cr_assert(strstr(why, "not a GGUF block type"), "%s", why);
    cr_assert_not(loom_cuda_gguf_plan_group(k4, r2, 0, 256, &l, why, sizeof why));
    cr_assert_not(loom_cuda_gguf_plan_group(k4, r2, 4, 256, &l, why, sizeof why));
    const int64_t neg[2] = {8, -1};
    cr_assert_not(loom_cuda_gguf_plan_group(k4, neg, 2, 256, &l, why, sizeof why));
}

Test(cuda_gguf_layout, column_windows_on_whole_blocks) {
    size_t off = 0, width = 0;
    char why[200] = "";
    /* Llama-3-8B down (14336 columns) over 2 ranks: 28 super-blocks each */
    cr_assert(loom_cuda_gguf_window(LOOM_CUDA_GGUF_Q4_K, 14336, 7168, 7168, &off, &width, why,
                                    sizeof why), "%s", why);
    cr_assert_eq(off, 28 * 144);
    cr_assert_eq(width, 28 * 144);
    /* SmolLM2 O (576 columns, 9 heads of 64) over 3 ranks: 6 q4_1 blocks each */
    cr_assert(loom_cuda_gguf_window(LOOM_CUDA_GGUF_Q4_1, 576, 384, 192, &off, &width, why, sizeof why),
              "%s", why);
    cr_assert_eq(off, 12 * 20);
    cr_assert_eq(width, 6 * 20);
    /* the whole row */
    cr_assert(loom_cuda_gguf_window(LOOM_CUDA_GGUF_Q6_K, 4096, 0, 4096, &off, &width, why, sizeof why));
    cr_assert_eq(off, 0);
    cr_assert_eq(width, 16 * 210);
    /* cuts a block: 4096 columns of q4_k over 3 ranks would need 1365.3 */
    cr_assert_not(loom_cuda_gguf_window(LOOM_CUDA_GGUF_Q4_K, 4096, 1408, 1344, &off, &width, why,
                                        sizeof why));
    cr_assert(strstr(why, "whole q4_k blocks of 256"), "%s", why);
    /* 192 columns of q4_k (SmolLM2 O over 3 ranks, had it been q4_k) */
    cr_assert_not(loom_cuda_gguf_window(LOOM_CUDA_GGUF_Q4_K, 576, 192, 192, &off, &width, why,
                                        sizeof why));
    /* outside the row, empty, unknown type */
    cr_assert_not(loom_cuda_gguf_window(LOOM_CUDA_GGUF_Q4_0, 576, 512, 128, &off, &width, why, sizeof why));
    cr_assert(strstr(why, "outside"), "%s", why);
    cr_assert_not(loom_cuda_gguf_window(LOOM_CUDA_GGUF_Q4_0, 576, 0, 0, &off, &width, why, sizeof why));
    cr_assert_not(loom_cuda_gguf_window((loom_cuda_gguf)LOOM_DTYPE_F32, 576, 0, 576, &off, &width,
                                        why, sizeof why));
}

/* Random groups of 1..3 parts of random types and rows, some with a column
 * window: copy every part's window the loader's way (one strided copy into
 * part_offset) and check each segment row against the source blocks. */
Test(cuda_gguf_layout, loader_copies_land_on_segment_rows) {
    test_rng r = rng_seeded("cuda_gguf_layout.loader_copies_land_on_segment_rows");
    for (int iter = 0; iter < 200; iter++) {
        const int nparts = 1 + (int)rng_int(&r, 3);
        const bool kquants = rng_int(&r, 2) == 0;
        const int64_t cols = kquants ? 256 * (1 + (int64_t)rng_int(&r, 6))
                                     : 32 * (1 + (int64_t)rng_int(&r, 40));
        /* a window of whole blocks of the largest block in play (256 for
         * k-quants), as a tensor-parallel rank keeps */
        const int64_t be = kquants ? 256 : 32, nb = cols / be;
        const int64_t c0 = be * (int64_t)rng_int(&r, nb);
        const int64_t nc = be * (1 + (int64_t)rng_int(&r, nb - c0 / be));
        loom_cuda_gguf ty[3];
        int64_t rows[3], src_rows[3], r0[3];
        uint8_t *src[3];
        for (int i = 0; i < nparts; i++) {
            ty[i] = kquants ? (rng_int(&r, 2) ? LOOM_CUDA_GGUF_Q4_K : LOOM_CUDA_GGUF_Q6_K)
                            : all_types[(int[]){0, 1, 4}[rng_int(&r, 3)]];
            src_rows[i] = 1 + (int64_t)rng_int(&r, 40);
            r0[i] = (int64_t)rng_int(&r, src_rows[i]);
            rows[i] = 1 + (int64_t)rng_int(&r, src_rows[i] - r0[i]);
            const size_t n = (size_t)src_rows[i] * loom_cuda_gguf_row_bytes(ty[i], cols);
            src[i] = malloc(n);
            for (size_t j = 0; j < n; j++) src[i][j] = (uint8_t)rng_int(&r, 256);
        }
        loom_cuda_gguf_layout l;
        char why[200] = "";
        cr_assert(loom_cuda_gguf_plan_group(ty, rows, nparts, nc, &l, why, sizeof why), "%s", why);
        cr_assert_eq(l.bytes % 16, 0);
        uint8_t *dev = calloc(1, l.bytes);
        for (int i = 0; i < nparts; i++) { /* cb_upload_gguf's cudaMemcpy2DAsync */
            size_t so, width;
            cr_assert(loom_cuda_gguf_window(ty[i], cols, c0, nc, &so, &width, why, sizeof why), "%s", why);
            const size_t pitch = loom_cuda_gguf_row_bytes(ty[i], cols);
            for (int64_t q = 0; q < rows[i]; q++)
                memcpy(dev + l.part_offset[i] + (size_t)q * width,
                       src[i] + (size_t)(r0[i] + q) * pitch + so, width);
        }
        /* each segment: rows of its type, its parts' rows in order */
        int part = 0;
        int64_t left = rows[0];
        for (int s = 0; s < l.nseg; s++) {
            const size_t rb = loom_cuda_gguf_row_bytes(l.seg[s].type, nc);
            cr_assert_eq(l.seg[s].offset % 16, 0);
            /* the kernels read up to the next 16-byte boundary past the end */
            cr_assert_leq((l.seg[s].offset + (size_t)l.seg[s].rows * rb + 15) / 16 * 16, l.bytes);
            for (int64_t q = 0; q < l.seg[s].rows; q++) {
                while (left == 0) left = rows[++part];
                cr_assert_eq(ty[part], l.seg[s].type);
                const int64_t src_row = r0[part] + (rows[part] - left);
                const size_t so = loom_cuda_gguf_row_bytes(ty[part], c0);
                const size_t pitch = loom_cuda_gguf_row_bytes(ty[part], cols);
                cr_assert_eq(memcmp(dev + l.seg[s].offset + (size_t)q * rb,
                                    src[part] + (size_t)src_row * pitch + so, rb), 0,
                             "iter %d segment %d row %lld", iter, s, (long long)q);
                left--;
            }
        }
        cr_assert_eq(part, nparts - 1);
        cr_assert_eq(left, 0);
        free(dev);
        for (int i = 0; i < nparts; i++) free(src[i]);
    }
}

Test(cuda_gguf_layout, q5_0_windows_rewritten_as_q8_0_keep_every_value) {
    test_rng r = rng_seeded("cuda_gguf_layout.q5_0_as_q8_0");
    enum { MAXB = 24, MAXR = 5 };
    /* rows up to 7 bytes apart beyond their blocks */
    static uint8_t src[MAXR * (MAXB * LOOM_GGUF_Q5_0_BYTES + 7)], dst[MAXR * MAXB * LOOM_GGUF_Q8_0_BYTES + 64];
    for (int it = 0; it < 200; it++) {
        const int64_t nb = 1 + rng_int(&r, MAXB), cols = 32 * nb, nr = 1 + rng_int(&r, MAXR);
        const int64_t b0 = rng_int(&r, nb), nbw = 1 + rng_int(&r, nb - b0);
        const size_t pitch = (size_t)nb * LOOM_GGUF_Q5_0_BYTES + (size_t)rng_int(&r, 8);
        for (size_t i = 0; i < sizeof src; i++) src[i] = (uint8_t)rng_int(&r, 256);
        for (int64_t row = 0; row < nr; row++) /* finite scales: f16 exponents below 31 */
            for (int64_t b = 0; b < nb; b++) src[(size_t)row * pitch + (size_t)b * LOOM_GGUF_Q5_0_BYTES + 1] &= 0x3B;
        memset(dst, 0xEE, sizeof dst);
        char why[160] = "";
        cr_assert(loom_cuda_q5_0_rows_as_q8_0(src, pitch, cols, nr, 32 * b0, 32 * nbw, dst, why, sizeof why), "%s",
                  why);
        const size_t width = loom_cuda_gguf_row_bytes(LOOM_CUDA_GGUF_Q8_0, 32 * nbw);
        for (int64_t row = 0; row < nr; row++)
            for (int64_t b = 0; b < nbw; b++) {
                float want[32], got[32];
                loom_gguf_dec_q5_0(src + (size_t)row * pitch + (size_t)(b0 + b) * LOOM_GGUF_Q5_0_BYTES, want);
                loom_gguf_dec_q8_0(dst + (size_t)row * width + (size_t)b * LOOM_GGUF_Q8_0_BYTES, got);
                cr_assert(!memcmp(want, got, sizeof want), "row %lld block %lld of window [%lld, %lld)",
                          (long long)row, (long long)b, (long long)b0, (long long)(b0 + nbw));
            }
        for (size_t i = (size_t)nr * width; i < sizeof dst; i++) cr_assert_eq(dst[i], 0xEE, "wrote byte %zu", i);
    }
    char why[160] = "";
    cr_assert(!loom_cuda_q5_0_rows_as_q8_0(src, 64 * 22 / 32, 64, 1, 16, 32, dst, why, sizeof why));
    cr_assert(strstr(why, "whole"), "%s", why);
    cr_assert(!loom_cuda_q5_0_rows_as_q8_0(src, 64 * 22 / 32, 64, 1, 32, 64, dst, why, sizeof why));
    cr_assert(strstr(why, "outside"), "%s", why);
}
