/*
 * kernels/cuda/wgmma.cuh — Hopper warpgroup MMA (sm_90a) for the tiled
 * quantized kernel (qtiled.cu): wgmma.mma_async m64nNk16 with A from
 * registers (each warp of the warpgroup its 16 rows, the fragment layout of
 * mma.sync m16n8k16's A) and B, N x 16 K-major, from shared memory through
 * a matrix descriptor; fp32 accumulators, D = A B + D (scale-d 1). D's
 * layout per warp is mma.sync's C for each 8 columns: d[4 i + 0, 1] row g,
 * columns 8 i + 2 t, + 1; d[4 i + 2, 3] row g + 8, the same.
 *
 * The lc_wgmma<T, N> bodies below list every accumulator register as its
 * own asm operand (the instruction takes D as N / 2 registers a thread, and
 * inline asm has no array operands), one body per N.
 */
#ifndef LOOM_CUDA_WGMMA_CUH
#define LOOM_CUDA_WGMMA_CUH

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <stdint.h>

/* Shared-memory matrix descriptor of a K-major operand in the 128-byte
 * swizzle: rows of 128 bytes (64 16-bit elements of K), 8-row atoms of
 * 1024 bytes (1024-aligned), 16-byte chunk c of row r stored at chunk
 * c ^ (r % 8). addr: the shared address of the first row's k-step (atom
 * base + 32 bytes a k16 step). Leading offset unused (1), stride 1024
 * bytes between 8-row groups, layout 1 = 128B swizzle (bits 62-63). */
__device__ __forceinline__ uint64_t lc_wg_desc_sw128(uint32_t addr) {
    return (uint64_t)((addr & 0x3FFFFu) >> 4) | ((uint64_t)1 << 16) | ((uint64_t)(1024 >> 4) << 32) |
           ((uint64_t)1 << 62);
}

__device__ __forceinline__ void lc_wg_fence() { asm volatile("wgmma.fence.sync.aligned;" ::: "memory"); }
__device__ __forceinline__ void lc_wg_commit() { asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory"); }
template <int N> __device__ __forceinline__ void lc_wg_wait() {
    asm volatile("wgmma.wait_group.sync.aligned %0;" ::"n"(N) : "memory");
}
/* Keeps the compiler from moving accesses of an accumulator register
 * across the asynchronous MMA's issue or wait. */
__device__ __forceinline__ void lc_wg_reg_fence(float &r) { asm volatile("" : "+f"(r)::"memory"); }
/* Makes this thread's generic-proxy shared-memory writes (cp.async landed)
 * visible to the async proxy that wgmma reads B through. */
__device__ __forceinline__ void lc_wg_proxy_fence() { asm volatile("fence.proxy.async.shared::cta;" ::: "memory"); }

/* Moves registers between the warpgroups of a warp-specialized CTA: a
 * producer warpgroup gives up its surplus (dec) for its consumers (inc,
 * which waits until the pool has them). Every warp of a warpgroup runs the
 * same one; R a multiple of 8 in 24..256. */
template <int R> __device__ __forceinline__ void lc_wg_regs_dec() {
    asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;" ::"n"(R));
}
template <int R> __device__ __forceinline__ void lc_wg_regs_inc() {
    asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;" ::"n"(R));
}

/* ------------------------------------------- mbarriers and bulk copies
 * (the TMA pipeline of qtiled.cu's wgmma path). A wait that has not seen
 * its phase after 2^34 cycles (~9 s) faults (a kernel error, not a hang). */
__device__ __forceinline__ void lc_mbar_init(uint32_t bar, unsigned count) {
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(bar), "r"(count) : "memory");
}
/* the inits visible to the async proxy (the bulk copies complete on them) */
__device__ __forceinline__ void lc_mbar_init_fence() {
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
}
__device__ __forceinline__ void lc_mbar_arrive(uint32_t bar) {
    asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];" ::"r"(bar) : "memory");
}
__device__ __forceinline__ void lc_mbar_arrive_tx(uint32_t bar, uint32_t bytes) {
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(bar), "r"(bytes) : "memory");
}
__device__ __forceinline__ void lc_mbar_wait(uint32_t bar, uint32_t parity) {
    uint32_t done;
    asm volatile("{\n.reg .pred p;\nmbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\nselp.u32 %0, 1, 0, p;\n}\n"
                 : "=r"(done)
                 : "r"(bar), "r"(parity)
                 : "memory");
    if (done) return;
    const long long t0 = clock64();
    for (;;) {
        asm volatile("{\n.reg .pred p;\nmbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\nselp.u32 %0, 1, 0, p;\n}\n"
                     : "=r"(done)
                     : "r"(bar), "r"(parity)
                     : "memory");
        if (done) return;
        /* a stage that never fills is a protocol bug: fault (an error on
         * the stream) rather than hang, but only after 2^34 cycles (~9 s at
         * 1.98 GHz: a whole kernel here takes milliseconds; far past what
         * time-slicing with other contexts costs a wait). The fault is a
         * store to address 0 (an illegal address), not `trap`: with a trap
         * in the kernel ptxas ignores setmaxnreg's budget and serializes
         * the wide kernel's wgmmas (C7512). */
        if (clock64() - t0 > (1ll << 34))
            asm volatile("st.global.u32 [%0], %1;" ::"l"(0ull), "r"(0u) : "memory");
    }
}
/* bytes (a multiple of 16, both 16-aligned) global -> shared, completing on bar */
__device__ __forceinline__ void lc_bulk_g2s(uint32_t dst, const void *src, uint32_t bytes, uint32_t bar) {
    asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];" ::"r"(dst),
                 "l"(src), "r"(bytes), "r"(bar)
                 : "memory");
}
/* a 2-D tensor-map box (c0 the inner coordinate) -> shared, completing on bar */
__device__ __forceinline__ void lc_tma_2d(uint32_t dst, const void *tmap, int c0, int c1, uint32_t bar) {
    asm volatile("cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3}], [%4];" ::
                     "r"(dst),
                 "l"(tmap), "r"(c0), "r"(c1), "r"(bar)
                 : "memory");
}

/* a 3-D tensor-map box (c0 the innermost coordinate) -> shared, completing on bar */
__device__ __forceinline__ void lc_tma_3d(uint32_t dst, const void *tmap, int c0, int c1, int c2, uint32_t bar) {
    asm volatile(
        "cp.async.bulk.tensor.3d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3, %4}], [%5];" ::
            "r"(dst),
        "l"(tmap), "r"(c0), "r"(c1), "r"(c2), "r"(bar)
        : "memory");
}

template <typename T, int N> struct lc_wgmma;

/* The accumulator operands, 8 at a time (the instruction takes D as N / 2
 * registers a thread and inline asm has no array operands). */
#define LC_WG_D8(i)                                                                                       \
    "+f"(d[(i)]), "+f"(d[(i) + 1]), "+f"(d[(i) + 2]), "+f"(d[(i) + 3]), "+f"(d[(i) + 4]), "+f"(d[(i) + 5]), \
        "+f"(d[(i) + 6]), "+f"(d[(i) + 7])
#define LC_WG_D16(i) LC_WG_D8(i), LC_WG_D8((i) + 8)
#define LC_WG_D32(i) LC_WG_D16(i), LC_WG_D16((i) + 16)
#define LC_WG_D64(i) LC_WG_D32(i), LC_WG_D32((i) + 32)
#define LC_WG_D128(i) LC_WG_D64(i), LC_WG_D64((i) + 64)

#define LC_WG_REGS32                                                                            \
    "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15"
#define LC_WG_TAIL32 "}, {%16, %17, %18, %19}, %20, p, 1, 1, 0;\n}\n"
#define LC_WG_PRED32 "%21"
#define LC_WG_REGS64                                                                            \
    "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15,"  \
    "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31"
#define LC_WG_TAIL64 "}, {%32, %33, %34, %35}, %36, p, 1, 1, 0;\n}\n"
#define LC_WG_PRED64 "%37"
#define LC_WG_REGS128                                                                            \
    "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15,"  \
    "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31,"  \
    "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47,"  \
    "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63"
#define LC_WG_TAIL128 "}, {%64, %65, %66, %67}, %68, p, 1, 1, 0;\n}\n"
#define LC_WG_PRED128 "%69"
#define LC_WG_REGS256                                                                            \
    "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15,"  \
    "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31,"  \
    "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47,"  \
    "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63,"  \
    "%64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79,"  \
    "%80, %81, %82, %83, %84, %85, %86, %87, %88, %89, %90, %91, %92, %93, %94, %95,"  \
    "%96, %97, %98, %99, %100, %101, %102, %103, %104, %105, %106, %107, %108, %109, %110, %111,"  \
    "%112, %113, %114, %115, %116, %117, %118, %119, %120, %121, %122, %123, %124, %125, %126, %127"
#define LC_WG_TAIL256 "}, {%128, %129, %130, %131}, %132, p, 1, 1, 0;\n}\n"
#define LC_WG_PRED256 "%133"

/* D (+)= A B for N = n: TY the C++ type, PTX its wgmma name. */
#define LC_WGMMA(TY, PTX, n)                                                                              \
    template <> struct lc_wgmma<TY, n> {                                                                  \
        static __device__ __forceinline__ void mma(float *d, const uint32_t *a, uint64_t desc) {          \
            asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, " LC_WG_PRED##n ", 0;\n"                       \
                         "wgmma.mma_async.sync.aligned.m64n" #n "k16.f32." PTX "." PTX " {" LC_WG_REGS##n \
                         LC_WG_TAIL##n                                                                    \
                         : LC_WG_DN##n                                                                   \
                         : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc), "r"(1));               \
        }                                                                                                 \
    };
#define LC_WG_DN32 LC_WG_D16(0)
#define LC_WG_DN64 LC_WG_D32(0)
#define LC_WG_DN128 LC_WG_D64(0)
#define LC_WG_DN256 LC_WG_D128(0)

LC_WGMMA(__nv_bfloat16, "bf16", 32)
LC_WGMMA(__half, "f16", 32)
LC_WGMMA(__nv_bfloat16, "bf16", 64)
LC_WGMMA(__half, "f16", 64)
LC_WGMMA(__nv_bfloat16, "bf16", 128)
LC_WGMMA(__half, "f16", 128)
LC_WGMMA(__nv_bfloat16, "bf16", 256)
LC_WGMMA(__half, "f16", 256)

#undef LC_WGMMA

#endif
