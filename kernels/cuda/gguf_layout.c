/*
 * kernels/cuda/gguf_layout.c — see gguf_layout.h. Pure C: built into the
 * cuda kernels library and, on its own, into the cpu test suite.
 */
#include "gguf_layout.h"

#include <stdarg.h>
#include <stdio.h>

#include "formats/dtype.h"
#include "formats/gguf_blocks.h"

static int gl_why(char *why, size_t n, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static int gl_why(char *why, size_t n, const char *fmt, ...) {
    if (why && n) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(why, n, fmt, ap);
        va_end(ap);
    }
    return 0;
}

/* The types are loom dtypes (gguf_layout.h); their sizes and names are
 * formats/'s. */
_Static_assert((int)LOOM_CUDA_GGUF_Q8_0 == (int)LOOM_DTYPE_Q8_0 &&
                   (int)LOOM_CUDA_GGUF_Q4_0 == (int)LOOM_DTYPE_Q4_0 &&
                   (int)LOOM_CUDA_GGUF_Q4_1 == (int)LOOM_DTYPE_Q4_1 &&
                   (int)LOOM_CUDA_GGUF_Q4_K == (int)LOOM_DTYPE_Q4_K &&
                   (int)LOOM_CUDA_GGUF_Q6_K == (int)LOOM_DTYPE_Q6_K,
               "loom_cuda_gguf values must be loom_dtype's");

static int gl_known(loom_cuda_gguf t) {
    switch (t) {
    case LOOM_CUDA_GGUF_Q8_0: case LOOM_CUDA_GGUF_Q4_0: case LOOM_CUDA_GGUF_Q4_1:
    case LOOM_CUDA_GGUF_Q4_K: case LOOM_CUDA_GGUF_Q6_K: return 1;
    default: return 0;
    }
}

int loom_cuda_gguf_block_elems(loom_cuda_gguf t) {
    return gl_known(t) ? (int)loom_dtype_block_elems((loom_dtype)t) : 0;
}

int loom_cuda_gguf_block_bytes(loom_cuda_gguf t) {
    return gl_known(t) ? (int)loom_dtype_block_bytes((loom_dtype)t) : 0;
}

const char *loom_cuda_gguf_name(loom_cuda_gguf t) {
    return gl_known(t) ? loom_dtype_name((loom_dtype)t) : "?";
}

size_t loom_cuda_gguf_row_bytes(loom_cuda_gguf t, int64_t k) {
    return gl_known(t) ? loom_dtype_row_bytes((loom_dtype)t, k) : 0;
}

int loom_cuda_gguf_ok(loom_cuda_gguf t, int64_t k) {
    const int be = loom_cuda_gguf_block_elems(t);
    return be > 0 && k > 0 && k % be == 0 && k < ((int64_t)1 << 31);
}

static size_t gl_round16(size_t n) { return (n + 15) & ~(size_t)15; }

int loom_cuda_gguf_plan_group(const loom_cuda_gguf *types, const int64_t *rows, int nparts,
                              int64_t k, loom_cuda_gguf_layout *out, char *why, size_t n) {
    *out = (loom_cuda_gguf_layout){0};
    if (nparts < 1 || nparts > LOOM_CUDA_QSEG_MAX)
        return gl_why(why, n, "%d parts; a fused group has 1 to %d", nparts, LOOM_CUDA_QSEG_MAX);
    size_t pos = 0;          /* end of the last row written             */
    loom_cuda_gguf cur = LOOM_CUDA_GGUF_NONE;
    for (int i = 0; i < nparts; i++) {
        if (!loom_cuda_gguf_ok(types[i], k))
            return loom_cuda_gguf_block_elems(types[i])
                       ? gl_why(why, n, "part %d (%s): %lld columns are not whole blocks of %d", i,
                                loom_cuda_gguf_name(types[i]), (long long)k,
                                loom_cuda_gguf_block_elems(types[i]))
                       : gl_why(why, n, "part %d has type %d, not a GGUF block type the cuda "
                                "kernels read (q4_0, q4_1, q4_k, q6_k, q8_0)", i, (int)types[i]);
        if (rows[i] < 0) return gl_why(why, n, "part %d has %lld rows", i, (long long)rows[i]);
        if (types[i] != cur) { /* a new segment, on a 16-byte boundary */
            pos = gl_round16(pos);
            out->seg[out->nseg++] = (loom_cuda_gguf_seg_layout){.type = types[i], .offset = pos};
            cur = types[i];
        }
        out->part_offset[i] = pos;
        out->seg[out->nseg - 1].rows += rows[i];
        pos += (size_t)rows[i] * loom_cuda_gguf_row_bytes(types[i], k);
    }
    out->bytes = gl_round16(pos);
    return 1;
}

int loom_cuda_gguf_window(loom_cuda_gguf t, int64_t cols, int64_t c0, int64_t nc,
                          size_t *src_offset, size_t *width, char *why, size_t n) {
    const int be = loom_cuda_gguf_block_elems(t);
    if (be == 0)
        return gl_why(why, n, "type %d is not a GGUF block type the cuda kernels read", (int)t);
    if (c0 < 0 || nc <= 0 || c0 + nc > cols)
        return gl_why(why, n, "columns [%lld, %lld) are outside a row of %lld", (long long)c0,
                      (long long)(c0 + nc), (long long)cols);
    if (cols % be || c0 % be || nc % be)
        return gl_why(why, n, "columns [%lld, %lld) of %lld do not start and end on whole %s "
                      "blocks of %d", (long long)c0, (long long)(c0 + nc), (long long)cols,
                      loom_cuda_gguf_name(t), be);
    *src_offset = loom_cuda_gguf_row_bytes(t, c0);
    *width = loom_cuda_gguf_row_bytes(t, nc);
    return 1;
}

int loom_cuda_q5_0_rows_as_q8_0(const uint8_t *src, size_t pitch, int64_t cols, int64_t nr, int64_t c0,
                                int64_t nc, uint8_t *dst, char *why, size_t n) {
    /* q5_0 and q8_0 blocks hold the same 32 elements: q8_0's window check
     * is q5_0's */
    size_t off8, width;
    if (!loom_cuda_gguf_window(LOOM_CUDA_GGUF_Q8_0, cols, c0, nc, &off8, &width, why, n)) return 0;
    const size_t off5 = (size_t)(c0 / LOOM_GGUF_Q5_0_ELEMS) * LOOM_GGUF_Q5_0_BYTES;
    for (int64_t r = 0; r < nr; r++)
        for (int64_t b = 0; b < nc / LOOM_GGUF_Q5_0_ELEMS; b++)
            loom_gguf_q5_0_to_q8_0(src + (size_t)r * pitch + off5 + (size_t)b * LOOM_GGUF_Q5_0_BYTES,
                                   dst + (size_t)r * width + (size_t)b * LOOM_GGUF_Q8_0_BYTES);
    return 1;
}
