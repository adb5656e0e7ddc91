/*
 * kernels/cpu/q8dot_avx512.c — q8dot_x86.h built for AVX-512 (F, BW, VL) on
 * top of AVX2 + FMA + F16C, without VNNI: the same 256-bit kernels as the
 * AVX2 build, EVEX-encoded, with 32 vector registers for the compiler to
 * keep the multi-token accumulators in (meson adds the flags for this file
 * alone; q8dot.c calls it only on a CPU that has them).
 */
#define QD_AVX512 1
#define QD_TABLE loom_cpu_q8dot_avx512
#define QD_TABLE2 loom_cpu_q8dot2_avx512
#define QD_TABLE4 loom_cpu_q8dot4_avx512
#define QD_TABLEG loom_cpu_q8gemm_avx512
#define QD_QUANTIZE loom_cpu_q8_quantize_avx512
#define QD_HTABLE loom_cpu_hdot_avx512
#include "q8dot_x86.h"
