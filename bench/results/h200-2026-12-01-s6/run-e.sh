#!/bin/bash
# Session 6, device call E (the final tree): every GPU kernel test, the
# backend test, gpu_bench at 1 and 2048 rows, and the engine compares bf16 vs
# FP8 / W8A8 / W8A16 with RMSNorm and SwiGLU inside the activation
# quantization. Everything lands in $OUT/e.tar.xz.
set -u
. scripts/gpu-env.sh
O=/tmp/s6e; mkdir -p $O
t0=$(date +%s); ts() { echo "[$(( $(date +%s) - t0 )) s] $*" | tee -a $O/run.log; }
finish() { tar -cJf $OUT/e.tar.xz -C /tmp s6e; }
trap finish EXIT
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv > $O/device.txt
export LOOM_QUANTIZER_DIR=$LB/plugins/quantizer
ts "gpu_kernel_tests (all)"
timeout 240 $LB/tests/gpu/gpu_kernel_tests > $O/kernel_tests.log 2>&1; ts "rc $?"
grep -E "^FAIL|passed|failed" $O/kernel_tests.log | tail -8 | tee -a $O/run.log
ts "gpu_backend_test"
timeout 150 $LB/tests/gpu/gpu_backend_test $LB/plugins/backend/cuda/loom-backend-cuda.so \
  $LB/plugins/backend/cpu/loom-backend-cpu.so > $O/backend_test.log 2>&1; ts "rc $?"
grep -E "^FAIL|passed|failed" $O/backend_test.log | tail -8 | tee -a $O/run.log
for m in 1 2048; do
  timeout 60 $LB/bench/gpu/gpu_bench $O/qb$m.json --quant-m $m > $O/qb$m.txt 2>&1
  grep -E "^    [a-z(]" $O/qb$m.txt | tee -a $O/run.log
done
q() { local f=$O/q-$(echo "$1" | tr ' ' '+')-$2.log left=$((530 - ($(date +%s) - t0)))
      [ $left -lt 40 ] && { ts "no time left for $1 $2"; return; }
      ts "engine: $1 $2"
      OUT=$O QUANT_SCHEMES="$1" QUANT_RUNS="$2" timeout $left scripts/gpu-check.sh quant > $f 2>&1
      ts "rc $?"; grep -E "===|output tokens/s|total tokens/s|TPOT p50|FAIL" $f | tee -a $O/run.log; }
q "fp8 int8-w8a8" prefill
q "fp8 int8-w8a8 int8-w8a16" b1
q "fp8 int8-w8a8" b64
ts done
