#!/bin/bash
# Session 7, device call B: the one-row GEMV shapes (kernels/cuda/qgemm.cu,
# lc_qgemv_shapes: warps per row group, pipelined loads, INT4's offset
# decode) — the linear-layer GPU tests (every shape against the float64
# reference) and gpu_bench --qgemv-sweep (each shape on the four Llama-3-8B
# matrices). Lands in $OUT/b.tar.xz.
set -u
. scripts/gpu-env.sh
O=/tmp/s7b; mkdir -p $O
finish() { tar -cJf $OUT/b.tar.xz -C /tmp s7b; }
trap finish EXIT
LOOM_GPU_KERNEL_TESTS=linear timeout 200 $LB/tests/gpu/gpu_kernel_tests > $O/kernel_tests.log 2>&1; echo "kernel tests rc $?" | tee $O/run.log
grep -E "^FAIL|passed|failed" $O/kernel_tests.log | tail -12 | tee -a $O/run.log
timeout 200 $LB/bench/gpu/gpu_bench $O/sweep.json --qgemv-sweep > $O/sweep.txt 2>&1; echo "sweep rc $?" | tee -a $O/run.log
grep -E "shape|us per layer" $O/sweep.txt | tee -a $O/run.log
