#!/bin/bash
# Session 8, device call B: qgemv_bulk.cu in four stage shapes (512 B x 6,
# 1 KB x 4, 2 KB x 3, 2 KB x 2 of each row) against qgemm.cu's kernel, one
# Llama-3-8B layer's linears chained in a CUDA graph at M = 1, plus the
# bulk kernel with its arithmetic skipped (the bare stream's rate); the
# linear-layer GPU tests (bulk bits = CUDA-core bits in every shape).
# Lands in $OUT/b.tar.xz.
set -u
. scripts/gpu-env.sh
O=/tmp/s8b; mkdir -p $O
finish() { tar -cJf $OUT/b.tar.xz -C /tmp s8b; }
trap finish EXIT
timeout 120 $LB/bench/gpu/gpu_bench $O/quant_m1.json --quant-m 1 > $O/quant_m1.txt 2>&1; echo "gpu_bench rc $?" | tee $O/run.log
grep -E "^    chained" $O/quant_m1.txt | tee -a $O/run.log
LOOM_GPU_KERNEL_TESTS=linear timeout 150 $LB/tests/gpu/gpu_kernel_tests > $O/kernel_tests.log 2>&1; echo "kernel tests rc $?" | tee -a $O/run.log
grep -E "^FAIL|passed|failed" $O/kernel_tests.log | tail -12 | tee -a $O/run.log
