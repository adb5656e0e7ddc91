/*
 * kernels/cuda/cp_async.cuh — asynchronous global -> shared copies
 * (cp.async, sm_80+) for the quantized linear kernels that stage tiles
 * through shared memory (qmma.cu, qtiled.cu). A copy whose `valid` is
 * false writes zeros (source size 0), so tiles past a matrix's edge need no
 * separate clearing. commit / wait carry a memory clobber: the compiler
 * must not move shared-memory reads across them.
 */
#ifndef LOOM_CUDA_CP_ASYNC_CUH
#define LOOM_CUDA_CP_ASYNC_CUH

/* 16 bytes global -> shared, bypassing L1 (.cg); zeros when !valid. */
__device__ __forceinline__ void lc_cp16(void *smem, const void *gmem, bool valid) {
    const unsigned s = (unsigned)__cvta_generic_to_shared(smem);
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"(s), "l"(gmem), "r"(valid ? 16 : 0));
}
/* 16 bytes global -> shared at a shared-window address (a kernel that
 * issues many copies a stage converts its buffer's address once); no
 * validity flag: the caller skips a copy past the matrix's edge. */
__device__ __forceinline__ void lc_cp16s(unsigned s, const void *gmem) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(s), "l"(gmem));
}
/* 4 bytes global -> shared (.ca); zeros when !valid. */
__device__ __forceinline__ void lc_cp4(void *smem, const void *gmem, bool valid) {
    const unsigned s = (unsigned)__cvta_generic_to_shared(smem);
    asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;" ::"r"(s), "l"(gmem), "r"(valid ? 4 : 0));
}
__device__ __forceinline__ void lc_cp_commit() { asm volatile("cp.async.commit_group;" ::: "memory"); }
/* Wait until at most N committed groups are still in flight. */
template <int N> __device__ __forceinline__ void lc_cp_wait() {
    asm volatile("cp.async.wait_group %0;" ::"n"(N) : "memory");
}

#endif
