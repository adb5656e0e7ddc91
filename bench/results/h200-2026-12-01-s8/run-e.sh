#!/bin/bash
# Session 8, device call E: the final tree — qgemv_bulk.cu opt-in, qgemm.cu's
# kernel at M = 1 as before (its arithmetic now in qgemv.cuh): the
# linear-layer GPU tests, one Llama-3-8B layer's linears at M = 1 (alone and
# chained in a CUDA graph; bulk kernel and probe beside), the engine at
# batch 1 (bf16 vs W8A16, bf16 vs int4). Lands in $OUT/e.tar.xz.
set -u
. scripts/gpu-env.sh
O=/tmp/s8e; mkdir -p $O
finish() { tar -cJf $OUT/e.tar.xz -C /tmp s8e; }
trap finish EXIT
LOOM_GPU_KERNEL_TESTS=linear timeout 120 $LB/tests/gpu/gpu_kernel_tests > $O/kernel_tests.log 2>&1; echo "kernel tests rc $?" | tee $O/run.log
grep -E "^FAIL|passed|failed" $O/kernel_tests.log | tail -8 | tee -a $O/run.log
timeout 60 $LB/bench/gpu/gpu_bench $O/quant_m1.json --quant-m 1 > $O/quant_m1.txt 2>&1; echo "gpu_bench rc $?" | tee -a $O/run.log
grep -E "^    chained|^    (bf16|int8_w8a16|int4_g128) " $O/quant_m1.txt | tee -a $O/run.log
OUT=$O QUANT_SCHEMES="int8-w8a16 int4" QUANT_RUNS="b1" timeout 170 scripts/gpu-check.sh quant > $O/quant.log 2>&1
grep -E "===|output tokens/s|TPOT" $O/quant.log | tee -a $O/run.log
