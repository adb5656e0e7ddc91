#!/bin/bash
# Session 7, device call D: INT4's one-row GEMV with the offset decode
# (lc_u4x8_off) and 4 rows a warp — the linear-layer GPU tests, the cuda vs
# cpu backend tests (int4 models included), the layer linears at M = 1 and
# 2 per shape, and the engine: Llama-3-8B bf16 vs int4 at batch 1
# (loom bench --compare). Lands in $OUT/d.tar.xz.
set -u
. scripts/gpu-env.sh
O=/tmp/s7d; mkdir -p $O
finish() { tar -cJf $OUT/d.tar.xz -C /tmp s7d; }
trap finish EXIT
git log -1 --format=%h > $O/commit.txt 2>/dev/null
LOOM_GPU_KERNEL_TESTS=linear timeout 150 $LB/tests/gpu/gpu_kernel_tests > $O/kernel_tests.log 2>&1; echo "kernel tests rc $?" | tee $O/run.log
grep -E "^FAIL|passed|failed" $O/kernel_tests.log | tail -8 | tee -a $O/run.log
timeout 150 $LB/tests/gpu/gpu_backend_test $LB/plugins/backend/cuda/loom-backend-cuda.so $LB/plugins/backend/cpu/loom-backend-cpu.so > $O/backend_test.log 2>&1; echo "backend test rc $?" | tee -a $O/run.log
grep -E "^FAIL|passed|failed" $O/backend_test.log | tail -8 | tee -a $O/run.log
for m in 1 2; do
  timeout 60 $LB/bench/gpu/gpu_bench $O/quant_m$m.json --quant-m $m > $O/quant_m$m.txt 2>&1
  grep -E "us per layer" $O/quant_m$m.txt | tee -a $O/run.log
done
OUT=$O QUANT_SCHEMES="int4" QUANT_RUNS="b1" timeout 330 scripts/gpu-check.sh quant > $O/quant.log 2>&1
tail -8 $O/quant.log | tee -a $O/run.log
