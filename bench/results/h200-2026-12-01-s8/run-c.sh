#!/bin/bash
# Session 8, device call C: qgemv_bulk.cu rewritten (64 rows a CTA, 256 B a row a stage) — W8A16 / INT4 at one
# row on the tensor cores, weights staged by bulk copies: one Llama-3-8B
# layer's linears at M = 1 (alone and chained in a CUDA graph, bulk kernel
# on / off / probe), the linear-layer GPU tests, the backend test, the
# engine at batch 1 (bf16 vs W8A16, bf16 vs int4). Lands in $OUT/c.tar.xz.
set -u
. scripts/gpu-env.sh
O=/tmp/s8c; mkdir -p $O
finish() { tar -cJf $OUT/c.tar.xz -C /tmp s8c; }
trap finish EXIT
timeout 100 $LB/bench/gpu/gpu_bench $O/quant_m1.json --quant-m 1 > $O/quant_m1.txt 2>&1; echo "gpu_bench rc $?" | tee $O/run.log
grep -E "^    chained|^    (bf16|int8_w8a16|int4_g128) " $O/quant_m1.txt | tee -a $O/run.log
LOOM_GPU_KERNEL_TESTS=linear timeout 150 $LB/tests/gpu/gpu_kernel_tests > $O/kernel_tests.log 2>&1; echo "kernel tests rc $?" | tee -a $O/run.log
grep -E "^FAIL|passed|failed" $O/kernel_tests.log | tail -14 | tee -a $O/run.log
timeout 200 $LB/tests/gpu/gpu_backend_test $LB/plugins/backend/cuda/loom-backend-cuda.so \
  $LB/plugins/backend/cpu/loom-backend-cpu.so > $O/backend_test.log 2>&1; echo "backend test rc $?" | tee -a $O/run.log
grep -E "^FAIL|passed|failed" $O/backend_test.log | tail -8 | tee -a $O/run.log
OUT=$O QUANT_SCHEMES="int8-w8a16 int4" QUANT_RUNS="b1" timeout 200 scripts/gpu-check.sh quant > $O/quant.log 2>&1
grep -E "===|output tokens/s|TPOT" $O/quant.log | tee -a $O/run.log
