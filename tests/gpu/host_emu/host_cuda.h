// tests/gpu/host_emu/host_cuda.h — the CUDA qualifiers, vector types and
// byte intrinsics the host emulations of kernels/cuda/*.cu share (each
// keeps its own thread model and the rest of its stand-ins). They run one
// warp at a time, so a CTA's shared memory can be a static.
#ifndef LOOM_HOST_CUDA_H
#define LOOM_HOST_CUDA_H
#include <cstdint>
#include <cstring>

#define __device__
#define __host__
#define __global__
#define __forceinline__ inline
#define __restrict__
#define __align__(x)
#define __launch_bounds__(x)
#define __shared__ static

struct uint4 { uint32_t x, y, z, w; };
static inline uint4 make_uint4(uint32_t a, uint32_t b, uint32_t c, uint32_t d) { return {a, b, c, d}; }
static inline uint4 __ldcs(const uint4 *p) { uint4 v; memcpy(&v, p, 16); return v; }
/* PRMT: byte i of the result is byte (s >> 4 i) & 7 of y:x */
static inline uint32_t __byte_perm(uint32_t x, uint32_t y, uint32_t s) {
    uint8_t b[8];
    memcpy(b, &x, 4), memcpy(b + 4, &y, 4);
    uint32_t r = 0;
    for (int i = 0; i < 4; i++) r |= (uint32_t)b[(s >> (4 * i)) & 7] << (8 * i);
    return r;
}
#endif
