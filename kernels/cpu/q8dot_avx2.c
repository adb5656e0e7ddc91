/*
 * kernels/cpu/q8dot_avx2.c — q8dot_x86.h built for AVX2 + FMA + F16C
 * (meson adds the flags for this file alone; q8dot.c calls it only on a
 * CPU that has them).
 */
#define QD_AVX512 0
#define QD_TABLE loom_cpu_q8dot_avx2
#define QD_TABLE2 loom_cpu_q8dot2_avx2
#define QD_TABLE4 loom_cpu_q8dot4_avx2
#define QD_TABLEG loom_cpu_q8gemm_avx2
#define QD_QUANTIZE loom_cpu_q8_quantize_avx2
#define QD_HTABLE loom_cpu_hdot_avx2
#include "q8dot_x86.h"
