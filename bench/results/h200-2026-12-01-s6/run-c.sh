#!/bin/bash
# Session 6, device call C (B again with its fixes: the activation quantizer at <= 512 threads, the script's log names; int4 batch 64 if time is left): linear-layer kernel tests (SwiGLU inside the
# activation quantization), engine compares bf16 vs each scheme (prefill,
# batch 1, batch 64), the W8A16 pipeline with the LM head quantized too,
# then gpu_backend_test. Everything lands in $OUT/c.tar.xz.
set -u
. scripts/gpu-env.sh
O=/tmp/s6c; mkdir -p $O
t0=$(date +%s); ts() { echo "[$(( $(date +%s) - t0 )) s] $*" | tee -a $O/run.log; }
finish() { tar -cJf $OUT/c.tar.xz -C /tmp s6c; }
trap finish EXIT
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv > $O/device.txt
export LOOM_QUANTIZER_DIR=$LB/plugins/quantizer
ts "kernel tests (linear)"
LOOM_GPU_KERNEL_TESTS=linear timeout 120 $LB/tests/gpu/gpu_kernel_tests > $O/kt_linear.log 2>&1; ts "rc $?"
grep -E "^FAIL|passed|failed" $O/kt_linear.log | tail -8 | tee -a $O/run.log
q() { local f=$O/q-$(echo "$1" | tr ' ' '+')-$2.log; ts "engine: $1 $2"
      OUT=$O QUANT_SCHEMES="$1" QUANT_RUNS="$2" timeout ${3:-200} scripts/gpu-check.sh quant > $f 2>&1
      ts "rc $?"; grep -E "===|output tokens/s|total tokens/s|TPOT p50|FAIL" $f | tee -a $O/run.log; }
q "fp8 int8-w8a8" prefill
q "fp8 int8-w8a8" b1
q "int8-w8a16 fp8 int8-w8a8" b64 240
ts "gpu_backend_test"
timeout 150 $LB/tests/gpu/gpu_backend_test $LB/plugins/backend/cuda/loom-backend-cuda.so \
  $LB/plugins/backend/cpu/loom-backend-cpu.so > $O/backend_test.log 2>&1; ts "rc $?"
grep -E "^FAIL|passed|failed" $O/backend_test.log | tail -8 | tee -a $O/run.log
left=$((555 - ($(date +%s) - t0)))
[ $left -gt 60 ] && q int4 b64 $left
ts done
