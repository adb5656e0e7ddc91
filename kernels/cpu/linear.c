/*
 * kernels/cpu/linear.c — linear layers through OpenBLAS.
 *
 * Weights are PyTorch's (out, in) row-major, so y = x w^T is a GEMM with the
 * second operand transposed, and a single row (decode) is a row-major
 * no-transpose GEMV: one dot product per output row, streaming the weight
 * once — the memory-bound case that sets decode speed. OpenBLAS threads
 * both; it has one process-wide pool sized by loom_cpu_blas_threads. A few
 * rows (batched decode) go to gemm_small.c instead, see cpu_kernels.h.
 */
#include "cpu_kernels.h"

#include <cblas.h>
#include <string.h>

void loom_cpu_linear(float *y, int64_t ldy, const float *x, int64_t ldx, const float *w,
                     const float *bias, int64_t M, int64_t N, int64_t K, float beta,
                     loom_cpu_pool *pool) {
    if (M <= 0 || N <= 0) return;
    /* M = 1 too: gemm_small's per-row result does not depend on M, so a
     * token computed alone or in a k+1-row speculative verify batch gets
     * bit-identical logits (and its one-row path beats sgemv here). */
    if (M <= LOOM_CPU_SMALL_M) {
        loom_cpu_linear_small_m(y, ldy, x, ldx, w, bias, M, N, K, beta, pool);
        return;
    }
    if (M == 1) {
        /* beta = 0 must not read y: scaling uninitialised memory by 0 can
         * keep a NaN in some OpenBLAS versions */
        if (beta == 0.0f) memset(y, 0, (size_t)N * sizeof(float));
        cblas_sgemv(CblasRowMajor, CblasNoTrans, (blasint)N, (blasint)K, 1.0f, w, (blasint)K, x,
                    1, beta, y, 1);
    } else {
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (blasint)M, (blasint)N, (blasint)K,
                    1.0f, x, (blasint)ldx, w, (blasint)K, beta, y, (blasint)ldy);
    }
    if (bias)
        for (int64_t r = 0; r < M; r++)
            for (int64_t c = 0; c < N; c++) y[r * ldy + c] += bias[c];
}

void loom_cpu_blas_threads(int n) { openblas_set_num_threads(n < 1 ? 1 : n); }

const char *loom_cpu_blas_core(void) { return openblas_get_corename(); }
