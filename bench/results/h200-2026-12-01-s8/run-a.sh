#!/bin/bash
# Session 8, device call A: qgemv_bulk.cu (one-row quantized GEMV with the
# weights staged by bulk copies) on top of session 7's final tree (never run
# on a GPU before): one Llama-3-8B layer's linears at M = 1 timed alone and
# chained in a CUDA graph, bulk kernel on and off; every GPU kernel test;
# the backend test (cuda vs cpu logits); the engine at batch 1, bf16 vs
# W8A16 / int4 / fp8. Lands in $OUT/a.tar.xz.
set -u
. scripts/gpu-env.sh
O=/tmp/s8a; mkdir -p $O
finish() { tar -cJf $OUT/a.tar.xz -C /tmp s8a; }
trap finish EXIT
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,clocks.max.mem --format=csv > $O/gpu.txt 2>&1
timeout 90 $LB/bench/gpu/gpu_bench $O/quant_m1.json --quant-m 1 > $O/quant_m1.txt 2>&1; echo "gpu_bench rc $?" | tee $O/run.log
grep -E "M=" $O/quant_m1.txt | tee -a $O/run.log
timeout 200 $LB/tests/gpu/gpu_kernel_tests > $O/kernel_tests.log 2>&1; echo "kernel tests rc $?" | tee -a $O/run.log
grep -E "^FAIL|passed|failed" $O/kernel_tests.log | tail -12 | tee -a $O/run.log
grep -c "bulk" $O/kernel_tests.log | tee -a $O/run.log
timeout 200 $LB/tests/gpu/gpu_backend_test $LB/plugins/backend/cuda/loom-backend-cuda.so \
  $LB/plugins/backend/cpu/loom-backend-cpu.so > $O/backend_test.log 2>&1; echo "backend test rc $?" | tee -a $O/run.log
grep -E "^FAIL|passed|failed" $O/backend_test.log | tail -8 | tee -a $O/run.log
OUT=$O QUANT_SCHEMES="int8-w8a16 int4" QUANT_RUNS="b1" timeout 200 scripts/gpu-check.sh quant > $O/quant.log 2>&1
grep -E "===|output tokens/s|TPOT" $O/quant.log | tee -a $O/run.log
