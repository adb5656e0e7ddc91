#!/bin/bash
# Session 7, device call G: qmma.cu's int8 path with 128-column steps (each
# lane 32 contiguous bytes of each row: a whole 128-byte line per row and
# step) and 2 steps of weights in flight — the linear-layer GPU tests, the
# layer linears at M = 16, 64, 128, the engine at batch 64 (bf16 vs W8A16).
# Lands in $OUT/g.tar.xz.
set -u
. scripts/gpu-env.sh
export LOOM_QUANTIZER_DIR=$LB/plugins/quantizer
O=/tmp/s7g; mkdir -p $O
finish() { tar -cJf $OUT/g.tar.xz -C /tmp s7g; }
trap finish EXIT
LOOM_GPU_KERNEL_TESTS=linear timeout 150 $LB/tests/gpu/gpu_kernel_tests > $O/kernel_tests.log 2>&1; echo "kernel tests rc $?" | tee $O/run.log
grep -E "^FAIL|passed|failed" $O/kernel_tests.log | tail -8 | tee -a $O/run.log
for m in 16 64 128; do
  timeout 90 $LB/bench/gpu/gpu_bench $O/quant_m$m.json --quant-m $m > $O/quant_m$m.txt 2>&1
  grep -E "^ +(bf16|int8_w8a16|int4_g128)[a-z_]* +M=" $O/quant_m$m.txt | tee -a $O/run.log
done
OUT=$O QUANT_SCHEMES="int8-w8a16" QUANT_RUNS="b64" timeout 200 scripts/gpu-check.sh quant > $O/quant.log 2>&1
grep -E "===|output tokens/s|TPOT" $O/quant.log | tee -a $O/run.log
