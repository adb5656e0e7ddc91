#!/bin/bash
# Session 6, device call D: the activation quantizer's two-pass kernel back for >= 128 rows: linear-layer kernel tests (SwiGLU inside the
# activation quantization), FP8 / W8A8 prefill and FP8 batch 1. Everything lands in $OUT/d.tar.xz.
set -u
. scripts/gpu-env.sh
O=/tmp/s6d; mkdir -p $O
t0=$(date +%s); ts() { echo "[$(( $(date +%s) - t0 )) s] $*" | tee -a $O/run.log; }
finish() { tar -cJf $OUT/d.tar.xz -C /tmp s6d; }
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
q fp8 b1
ts done
