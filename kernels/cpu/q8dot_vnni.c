/*
 * kernels/cpu/q8dot_vnni.c — q8dot_x86.h built for AVX-512 VNNI (256-bit
 * vpdpbusd through AVX-512 VL) on top of AVX2 + FMA + F16C (meson adds the
 * flags for this file alone; q8dot.c calls it only on a CPU that has them).
 */
#define QD_VNNI 1
#define QD_AVX512 1
#define QD_TABLE loom_cpu_q8dot_vnni
#define QD_TABLE2 loom_cpu_q8dot2_vnni
#define QD_TABLE4 loom_cpu_q8dot4_vnni
#define QD_TABLEG loom_cpu_q8gemm_vnni
#define QD_QUANTIZE loom_cpu_q8_quantize_vnni
#define QD_HTABLE loom_cpu_hdot_vnni
#include "q8dot_x86.h"
