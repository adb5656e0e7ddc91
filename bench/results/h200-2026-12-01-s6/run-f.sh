#!/bin/bash
# Session 6, device call F: the activation quantizer at >= 128 rows with few threads and 8 chunks each, kept in registers: linear-layer kernel tests (SwiGLU inside the
# activation quantization), FP8 / W8A8 prefill and FP8 batch 1. Everything lands in $OUT/f.tar.xz.
set -u
. scripts/gpu-env.sh
O=/tmp/s6f; mkdir -p $O
t0=$(date +%s); ts() { echo "[$(( $(date +%s) - t0 )) s] $*" | tee -a $O/run.log; }
finish() { tar -cJf $OUT/f.tar.xz -C /tmp s6f; }
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
ts done
