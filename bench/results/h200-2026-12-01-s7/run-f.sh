#!/bin/bash
# Session 7, device call F: qmma.cu with 4 steps of weights in flight in registers, 3-4 token tiles in shared memory, and taking every eligible M above 8 rows (W8A16 / INT4 above the GEMV's rows on
# the tensor cores, weights decoded in registers) — every GPU kernel test,
# the cuda vs cpu backend tests, the layer linears at M = 16 .. 256 (each
# next to the dequantize + cuBLASLt path it replaces: the *_deq rows), and
# the engine at batch 64: bf16 vs W8A16, bf16 vs int4. Lands in $OUT/f.tar.xz.
set -u
. scripts/gpu-env.sh
export LOOM_QUANTIZER_DIR=$LB/plugins/quantizer
O=/tmp/s7f; mkdir -p $O
finish() { tar -cJf $OUT/f.tar.xz -C /tmp s7f; }
trap finish EXIT
timeout 200 $LB/tests/gpu/gpu_kernel_tests > $O/kernel_tests.log 2>&1; echo "kernel tests rc $?" | tee $O/run.log
grep -E "^FAIL|passed|failed" $O/kernel_tests.log | tail -12 | tee -a $O/run.log
grep -E "qmma" $O/kernel_tests.log | head -40 > $O/qmma_tests.txt
for m in 12 16 32 64 128 256; do
  timeout 90 $LB/bench/gpu/gpu_bench $O/quant_m$m.json --quant-m $m > $O/quant_m$m.txt 2>&1
  grep -E "(bf16|w8a16|int4_g128)[a-z_]* +M=" $O/quant_m$m.txt | tee -a $O/run.log
done
OUT=$O QUANT_SCHEMES="int8-w8a16 int4" QUANT_RUNS="b64" timeout 400 scripts/gpu-check.sh quant > $O/quant.log 2>&1
grep -E "===|output tokens/s|TPOT" $O/quant.log | tee -a $O/run.log
timeout 150 $LB/tests/gpu/gpu_backend_test $LB/plugins/backend/cuda/loom-backend-cuda.so $LB/plugins/backend/cpu/loom-backend-cpu.so > $O/backend_test.log 2>&1; echo "backend test rc $?" | tee -a $O/run.log
grep -E "^FAIL|passed|failed" $O/backend_test.log | tail -8 | tee -a $O/run.log
