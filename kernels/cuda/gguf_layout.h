/*
 * kernels/cuda/gguf_layout.h — the host side of GGUF blocks on the device:
 * block geometry, which (type, K) the cuda kernels run, how the parts of a
 * fused group (Q/K/V, gate/up — possibly of different block types) become
 * row segments of one device allocation, and which column windows keep
 * whole blocks (tensor-parallel row-parallel layers).
 *
 * Pure C with no CUDA include, so the cpu test suite checks it
 * (tests/kernels/test_cuda_gguf_layout.c) and the cuda loader
 * (plugins/backend/cuda/cuda_load.c) and kernels (qgguf.cu) share it.
 *
 * Blocks stay exactly as the GGUF file stores them (formats/gguf_blocks.h
 * documents each layout); nothing is repacked. A segment is rows of one
 * block type, row after row with no padding (row_bytes = K / block_elems *
 * block_bytes), starting on a 16-byte boundary; the kernels may read up to
 * the next 16-byte boundary past a segment's last byte.
 */
#ifndef LOOM_CUDA_GGUF_LAYOUT_H
#define LOOM_CUDA_GGUF_LAYOUT_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* GGUF block types the cuda kernels read. The values are loom_dtype's
 * (loom/tensor.h, which this header does not include), so a loom dtype
 * casts to it; anything else is not a GGUF type here. */
typedef enum loom_cuda_gguf {
    LOOM_CUDA_GGUF_NONE = 0,
    LOOM_CUDA_GGUF_Q8_0 = 3,  /* 32 elems, 34 B: f16 d, int8 q[32]                  */
    LOOM_CUDA_GGUF_Q4_0 = 4,  /* 32 elems, 18 B: f16 d, nibbles; (q - 8) * d         */
    LOOM_CUDA_GGUF_Q4_1 = 5,  /* 32 elems, 20 B: f16 d, f16 m, nibbles; q * d + m    */
    LOOM_CUDA_GGUF_Q4_K = 6,  /* 256 elems, 144 B: f16 d, dmin, 6-bit scales, nibbles */
    LOOM_CUDA_GGUF_Q6_K = 7,  /* 256 elems, 210 B: ql, qh, int8 scales, f16 d        */
} loom_cuda_gguf;

/* Parts of one fused group (Q, K, V) and segments of one weight. */
#define LOOM_CUDA_QSEG_MAX 3

/* Elements / bytes per block; 0 for a type the kernels do not read. */
int loom_cuda_gguf_block_elems(loom_cuda_gguf t);
int loom_cuda_gguf_block_bytes(loom_cuda_gguf t);
/* Bytes of a row of k elements; 0 when k is not whole blocks or t unknown. */
size_t loom_cuda_gguf_row_bytes(loom_cuda_gguf t, int64_t k);
/* "q4_0" ... ; "?" for an unknown type. */
const char *loom_cuda_gguf_name(loom_cuda_gguf t);
/* Do the kernels run rows of k elements of type t? (A known type, k > 0 a
 * multiple of its block, k < 2^31.) */
int loom_cuda_gguf_ok(loom_cuda_gguf t, int64_t k);

/* One segment of a group's allocation. */
typedef struct loom_cuda_gguf_seg_layout {
    loom_cuda_gguf type;   /* block type of its rows                          */
    int64_t rows;          /* consecutive output rows                         */
    size_t offset;         /* bytes from the allocation's start, 16-aligned   */
} loom_cuda_gguf_seg_layout;

/* Where a fused group's parts go: consecutive parts of one type share a
 * segment (one kernel launch), a change of type starts the next. */
typedef struct loom_cuda_gguf_layout {
    int nseg;
    loom_cuda_gguf_seg_layout seg[LOOM_CUDA_QSEG_MAX];
    size_t part_offset[LOOM_CUDA_QSEG_MAX]; /* byte offset of part i's first row */
    size_t bytes;          /* the whole allocation, a multiple of 16          */
} loom_cuda_gguf_layout;

/* Lay out nparts (1..LOOM_CUDA_QSEG_MAX) parts of rows[i] rows (>= 0) of
 * types[i], each row k elements, in this order. Returns 1, or 0 with the
 * reason in why[n] (a type the kernels do not read, k not whole blocks). */
int loom_cuda_gguf_plan_group(const loom_cuda_gguf *types, const int64_t *rows, int nparts,
                              int64_t k, loom_cuda_gguf_layout *out, char *why, size_t n);

/* A column window [c0, c0 + nc) of rows of `cols` elements of type t (a
 * tensor-parallel rank's input columns of a row-parallel layer): the byte
 * offset of its first block in a row and its width in bytes. Returns 1, or
 * 0 with the reason when the window is outside the row or does not start
 * and end on whole blocks. */
int loom_cuda_gguf_window(loom_cuda_gguf t, int64_t cols, int64_t c0, int64_t nc,
                          size_t *src_offset, size_t *width, char *why, size_t n);

/* q5_0 has no kernel here: the loader uploads its blocks as the q8_0 blocks
 * of the same values (same scale, codes - 16: exact). Rows [0, nr) of the
 * column window [c0, c0 + nc) of a q5_0 tensor with rows of `cols`
 * elements at src, `pitch` bytes apart, to dst as dense q8_0 rows of
 * loom_cuda_gguf_row_bytes(Q8_0, nc) bytes. Returns 1, or 0 with the reason
 * when the window is outside the row or cuts a block. */
int loom_cuda_q5_0_rows_as_q8_0(const uint8_t *src, size_t pitch, int64_t cols, int64_t nr, int64_t c0,
                                int64_t nc, uint8_t *dst, char *why, size_t n);

#ifdef __cplusplus
}
#endif
#endif /* LOOM_CUDA_GGUF_LAYOUT_H */
