#!/bin/bash
# Session 9, device call A: the persistent bulk-copy tensor-core kernel for
# one row (qgemv_bulk.cu: W8A16 / FP8 / INT4, the token converted once per
# CTA, tiles balanced over the CTAs that fit): every GPU test (also the
# session-8 commits never run on a GPU), gpu_backend_test with the kernel
# on, one Llama-3-8B layer's linears chained at M = 1 (default kernels,
# bulk with 8 and 4 consumer warps, probe), and the engine at batch 1 with
# the kernel on (bf16 vs W8A16 / FP8 / INT4). Lands in $OUT/a.tar.xz.
set -u
. scripts/gpu-env.sh
O=/tmp/s9a; mkdir -p $O
finish() { tar -cJf $OUT/a.tar.xz -C /tmp s9a; }
trap finish EXIT
nvidia-smi --query-gpu=name,clocks.max.sm,memory.total --format=csv > $O/device.txt 2>&1
git rev-parse HEAD > $O/commit.txt 2>/dev/null; git status --short >> $O/commit.txt 2>/dev/null
timeout 200 $LB/tests/gpu/gpu_kernel_tests > $O/kernel_tests.log 2>&1; echo "kernel tests rc $?" | tee $O/run.log
grep -E "^FAIL|passed|failed" $O/kernel_tests.log | tail -12 | tee -a $O/run.log
grep -E "bulk" $O/kernel_tests.log | grep -c "^PASS" | sed 's/^/bulk PASS lines: /' | tee -a $O/run.log
timeout 70 $LB/bench/gpu/gpu_bench $O/quant_m1.json --quant-m 1 > $O/quant_m1.txt 2>&1; echo "gpu_bench rc $?" | tee -a $O/run.log
grep -E "^    chained" $O/quant_m1.txt | tee -a $O/run.log
LOOM_CUDA_QGEMV_BULK=1 timeout 150 $LB/tests/gpu/gpu_backend_test $LB/plugins/backend/cuda/loom-backend-cuda.so \
  $LB/plugins/backend/cpu/loom-backend-cpu.so > $O/backend_test_bulk.log 2>&1; echo "backend test (bulk on) rc $?" | tee -a $O/run.log
grep -E "^FAIL|passed|failed" $O/backend_test_bulk.log | tail -6 | tee -a $O/run.log
LOOM_CUDA_QGEMV_BULK=1 OUT=$O QUANT_SCHEMES="int8-w8a16 fp8 int4" QUANT_RUNS="b1" timeout 240 scripts/gpu-check.sh quant > $O/quant_bulk.log 2>&1
grep -E "===|output tokens/s|TPOT" $O/quant_bulk.log | tee -a $O/run.log
