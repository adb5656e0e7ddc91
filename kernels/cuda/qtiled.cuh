/*
 * kernels/cuda/qtiled.cuh — internal: the tiled W8A16 / INT4 layout's
 * register decode, used by qtiled.cu's kernels (1..512 rows, the
 * dequantize) and cut out as it is by tests/gpu/host_emu/qtiled_emu.sh.
 * The layout and what each lane's 16-byte vector holds are described at
 * the top of qtiled.cu.
 */
#ifndef LOOM_CUDA_QTILED_CUH
#define LOOM_CUDA_QTILED_CUH

#include <type_traits>

#include "common.cuh"
#include "mma.cuh" /* lc_i8x4_h2 */

__device__ __forceinline__ uint32_t lc_qt_word(const uint4 &v, int j) {
    return j == 0 ? v.x : j == 1 ? v.y : j == 2 ? v.z : v.w;
}

/* packed dt x2 arithmetic */
template <typename T> __device__ __forceinline__ uint32_t lc_qt_sub2(uint32_t a, uint32_t b) {
    uint32_t d;
    if constexpr (std::is_same<T, __half>::value) asm("sub.rn.f16x2 %0, %1, %2;" : "=r"(d) : "r"(a), "r"(b));
    else asm("sub.rn.bf16x2 %0, %1, %2;" : "=r"(d) : "r"(a), "r"(b));
    return d;
}
template <typename T> __device__ __forceinline__ uint32_t lc_qt_fma2(uint32_t a, uint32_t b, uint32_t c) {
    uint32_t d;
    if constexpr (std::is_same<T, __half>::value)
        asm("fma.rn.f16x2 %0, %1, %2, %3;" : "=r"(d) : "r"(a), "r"(b), "r"(c));
    else asm("fma.rn.bf16x2 %0, %1, %2, %3;" : "=r"(d) : "r"(a), "r"(b), "r"(c));
    return d;
}
__device__ __forceinline__ uint32_t lc_qt_lop3_or_and(uint32_t a, uint32_t mask, uint32_t magic) {
    uint32_t d; /* (a & mask) | magic */
    asm("lop3.b32 %0, %1, %2, %3, 0xEA;" : "=r"(d) : "r"(a), "r"(mask), "r"(magic));
    return d;
}

/* INT4 word (one k16 step) -> the A fragment a[0..3] in dt: w = (q - 8) s +
 * b' with (s2a, b2a) row g's group pair (s, b' = b + 8 s), (s2b, b2b) row
 * g + 8's. */
template <typename T>
__device__ __forceinline__ void lc_qt_dec4(uint32_t w, uint32_t s2a, uint32_t b2a, uint32_t s2b, uint32_t b2b,
                                           uint32_t *a) {
    /* the codes centred, q - 8 (exact): the pair's b is b + 8 s (tile scales) */
    constexpr uint32_t MAGIC = std::is_same<T, __half>::value ? 0x64006400u : 0x43004300u;
    constexpr uint32_t MAGIC8 = std::is_same<T, __half>::value ? 0x64086408u : 0x43084308u; /* MAGIC + 8 */
    const uint32_t q0 = lc_qt_sub2<T>(lc_qt_lop3_or_and(w, 0x000F000Fu, MAGIC), MAGIC8);
    const uint32_t q1 = lc_qt_sub2<T>(lc_qt_lop3_or_and(w >> 4, 0x000F000Fu, MAGIC), MAGIC8);
    const uint32_t q2 = lc_qt_sub2<T>(lc_qt_lop3_or_and(w >> 8, 0x000F000Fu, MAGIC), MAGIC8);
    const uint32_t q3 = lc_qt_sub2<T>(lc_qt_lop3_or_and(w >> 12, 0x000F000Fu, MAGIC), MAGIC8);
    a[0] = lc_qt_fma2<T>(q0, s2a, b2a);
    a[1] = lc_qt_fma2<T>(q1, s2b, b2b);
    a[2] = lc_qt_fma2<T>(q2, s2a, b2a);
    a[3] = lc_qt_fma2<T>(q3, s2b, b2b);
}

/* int8 word (bytes 0..3) -> two dt x2 of the exact codes (b0, b1), (b2, b3) */
template <typename T> __device__ __forceinline__ void lc_qt_dec8(uint32_t w, uint32_t &lo, uint32_t &hi) {
    if constexpr (std::is_same<T, __half>::value) {
        lc_i8x4_h2(w, lo, hi);
    } else {
        const uint32_t u = w ^ 0x80808080u; /* q + 128 */
        const float f0 = __uint_as_float(__byte_perm(u, 0x4B000000u, 0x7540u)) - 8388736.0f;
        const float f1 = __uint_as_float(__byte_perm(u, 0x4B000000u, 0x7541u)) - 8388736.0f;
        const float f2 = __uint_as_float(__byte_perm(u, 0x4B000000u, 0x7542u)) - 8388736.0f;
        const float f3 = __uint_as_float(__byte_perm(u, 0x4B000000u, 0x7543u)) - 8388736.0f;
        /* small integers: the upper halves are their exact bf16 */
        lo = __byte_perm(__float_as_uint(f0), __float_as_uint(f1), 0x7632u);
        hi = __byte_perm(__float_as_uint(f2), __float_as_uint(f3), 0x7632u);
    }
}

/* a dt value (low 16 bits of h) as float */
template <typename T> __device__ __forceinline__ float lc_qt_half_f(uint32_t h) {
    if constexpr (std::is_same<T, __half>::value) return __half2float(__ushort_as_half((unsigned short)h));
    else return __uint_as_float(h << 16);
}

/* The raw INT4 decode: a word (one k16 step) -> the A fragment a[0..3]
 * with the codes still under the magic, M + q (M = 1024 in f16, 128 in bf16): one LOP3 per two
 * weights; the caller takes the group's affine map off the sums ("raw",
 * qtiled.cu). */
template <typename T> __device__ __forceinline__ void lc_qt_raw4(uint32_t w, uint32_t *a) {
    constexpr uint32_t MAGIC = std::is_same<T, __half>::value ? 0x64006400u : 0x43004300u;
    a[0] = lc_qt_lop3_or_and(w, 0x000F000Fu, MAGIC);
    a[1] = lc_qt_lop3_or_and(w >> 4, 0x000F000Fu, MAGIC);
    a[2] = lc_qt_lop3_or_and(w >> 8, 0x000F000Fu, MAGIC);
    a[3] = lc_qt_lop3_or_and(w >> 12, 0x000F000Fu, MAGIC);
}

#endif
