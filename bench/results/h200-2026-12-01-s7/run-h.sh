#!/bin/bash
# Session 7, device call H: qmma.cu's int4 path reading whole 128-byte lines
# per row and step (256 columns as two 128-column blocks) — the linear-layer
# GPU tests, the layer linears at M = 64 and 16, the engine at batch 64
# (bf16 vs int4). Lands in $OUT/h.tar.xz.
set -u
. scripts/gpu-env.sh
export LOOM_QUANTIZER_DIR=$LB/plugins/quantizer
O=/tmp/s7h; mkdir -p $O
finish() { tar -cJf $OUT/h.tar.xz -C /tmp s7h; }
trap finish EXIT
LOOM_GPU_KERNEL_TESTS=linear timeout 90 $LB/tests/gpu/gpu_kernel_tests > $O/kernel_tests.log 2>&1; echo "kernel tests rc $?" | tee $O/run.log
grep -E "^FAIL|passed|failed" $O/kernel_tests.log | tail -8 | tee -a $O/run.log
for m in 64 16; do
  timeout 40 $LB/bench/gpu/gpu_bench $O/quant_m$m.json --quant-m $m > $O/quant_m$m.txt 2>&1
  grep -E "^ +(bf16|int8_w8a16|int4_g128)[a-z_]* +M=" $O/quant_m$m.txt | tee -a $O/run.log
done
OUT=$O QUANT_SCHEMES="int4" QUANT_RUNS="b64" timeout 110 scripts/gpu-check.sh quant > $O/quant.log 2>&1
grep -E "===|output tokens/s|TPOT" $O/quant.log | tee -a $O/run.log
