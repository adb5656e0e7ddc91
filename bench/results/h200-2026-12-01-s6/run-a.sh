#!/bin/bash
# Session 6, device call A: linear-layer kernel tests (FP8 scale vectors,
# one-row layouts), gpu_bench at M = 1 and 2048, FP8 prefill and W8A16
# batch-1 through the engine. Everything lands in $OUT/a.tar.xz.
set -u
. scripts/gpu-env.sh
O=/tmp/s6a; mkdir -p $O
t0=$(date +%s); ts() { echo "[$(( $(date +%s) - t0 )) s] $*" | tee -a $O/run.log; }
finish() { tar -cJf $OUT/a.tar.xz -C /tmp s6a; }
trap finish EXIT
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv > $O/device.txt
export LOOM_QUANTIZER_DIR=$LB/plugins/quantizer LOOM_COMMIT=${LOOM_COMMIT:-?}
ts "gpu_bench --quant-m 1"
timeout 120 $LB/bench/gpu/gpu_bench $O/qb1.json --quant-m 1 > $O/qb1.txt 2>&1; ts "rc $?"
ts "gpu_bench --quant-m 2048"
timeout 120 $LB/bench/gpu/gpu_bench $O/qb2048.json --quant-m 2048 > $O/qb2048.txt 2>&1; ts "rc $?"
grep -E "^    [a-z]" $O/qb1.txt $O/qb2048.txt | tee -a $O/run.log
ts "kernel tests (linear)"
LOOM_GPU_KERNEL_TESTS=linear timeout 200 $LB/tests/gpu/gpu_kernel_tests > $O/kt_linear.log 2>&1; ts "rc $?"
grep -E "FAIL|passed|failed" $O/kt_linear.log | tail -8 | tee -a $O/run.log
ts "engine: fp8 prefill compare"
OUT=$O QUANT_SCHEMES=fp8 QUANT_RUNS=prefill timeout 200 scripts/gpu-check.sh quant > $O/quant-fp8-prefill.log 2>&1; ts "rc $?"
grep -E "tokens/s|TTFT" $O/quant-fp8-prefill.log | tee -a $O/run.log
for lay in 1x8 2x4; do
  ts "engine: int8-w8a16 batch 1, LOOM_CUDA_QGEMV_M1=$lay"
  LOOM_CUDA_QGEMV_M1=$lay timeout 100 loom bench configs/gpu/llama3-8b-int8-w8a16.yaml --num-requests 3 --input-len 128 \
    --output-len 256 --set scheduler.max_num_seqs=1 --no-progress --json $O/w8a16-b1-$lay.json > $O/w8a16-b1-$lay.txt 2>&1
  ts "rc $?"; grep -E "TPOT p50|output tokens" $O/w8a16-b1-$lay.txt | tee -a $O/run.log
done
ts done
