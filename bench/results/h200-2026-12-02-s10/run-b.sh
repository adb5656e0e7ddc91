#!/bin/bash
# Session 10, device call B: the quantized CUDA-core GEMV with its first
# pass peeled (LOOM_CUDA_QGEMV_PEEL=1, call A's) or the next pass's loads
# at the bottom of each pass (=0; an experiment switch): linear-layer tests
# with =0, gpu_bench --quant-m 1 under each; then the engine at batch 1
# (bf16 vs W8A16 with its LM head quantized) on the better one, the LM head
# on the CUDA-core GEMV and on qgemv_bulk.cu's kernel (LOOM_CUDA_QGEMV_BULK=1
# with LOOM_CUDA_QGEMV_BULK_MIN_MB=200: only the head). Lands in $OUT/b.tar.xz.
set -u
. scripts/gpu-env.sh
O=/tmp/s10b; mkdir -p $O
finish() { tar -cJf $OUT/b.tar.xz -C /tmp s10b; }
trap finish EXIT
git rev-parse HEAD > $O/commit.txt 2>/dev/null; git status --short >> $O/commit.txt 2>/dev/null
LOOM_CUDA_QGEMV_PEEL=0 LOOM_GPU_KERNEL_TESTS=linear timeout 150 $LB/tests/gpu/gpu_kernel_tests > $O/kernel_tests_peel0.log 2>&1
echo "linear tests (peel 0) rc $?" | tee $O/run.log
grep -E "^FAIL|passed|failed" $O/kernel_tests_peel0.log | tail -8 | tee -a $O/run.log
for p in 0 1; do
  LOOM_CUDA_QGEMV_PEEL=$p timeout 120 $LB/bench/gpu/gpu_bench $O/quant_m1_peel$p.json --quant-m 1 > $O/quant_m1_peel$p.txt 2>&1
  echo "gpu_bench peel $p rc $?" | tee -a $O/run.log
  grep -E "^    (chained|mixed) +(int8_w8a16|fp8|int4_g128|int8_w8a8|bf16)(_late)? " $O/quant_m1_peel$p.txt | tee -a $O/run.log
done
# the better: lower sum of the mixed W8A16, FP8 and INT4 rows (early loads on)
s() { grep -E "^    mixed +(int8_w8a16|fp8|int4_g128) " $O/quant_m1_peel$1.txt | awk '{t += $4} END {print t}'; }
s0=$(s 0); s1=$(s 1); P=1; awk -v a="$s0" -v b="$s1" 'BEGIN {exit !(a < b)}' && P=0
echo "mixed sums: peel0 $s0 peel1 $s1 -> engine runs with LOOM_CUDA_QGEMV_PEEL=$P" | tee -a $O/run.log
for b in 0 1; do
  LOOM_CUDA_QGEMV_PEEL=$P LOOM_CUDA_QGEMV_BULK=$b LOOM_CUDA_QGEMV_BULK_MIN_MB=200 timeout 150 loom bench --compare \
    configs/gpu/llama3-8b-dummy.yaml configs/gpu/llama3-8b-int8-w8a16-head.yaml \
    --num-requests 3 --input-len 128 --output-len 256 --set scheduler.max_num_seqs=1 --no-progress \
    --json $O/w8a16-head-bulkhead$b.json > $O/w8a16-head-bulkhead$b.txt 2>&1; echo "compare bulk head $b rc $?" | tee -a $O/run.log
  grep -E "output tokens/s|TPOT p50" $O/w8a16-head-bulkhead$b.txt | tee -a $O/run.log
done
xz -f $O/kernel_tests_peel0.log
