#!/bin/bash
# Session 9, device call C: the final qgemv_bulk.cu (per-warp token, exact
# f16 integer decodes, producer releasing PDL at once): the linear-layer
# GPU tests, one layer's linears chained at M = 1, the engine's W8A16
# batch-1 decode with the kernel off and on (two runs back to back), and
# ncu's per-kernel GPU time of one W8A16 decode step with it on (graphs off;
# as session 5's profile/). Lands in $OUT/c.tar.xz.
set -u
. scripts/gpu-env.sh
O=/tmp/s9c; mkdir -p $O
finish() { tar -cJf $OUT/c.tar.xz -C /tmp s9c; }
trap finish EXIT
git rev-parse HEAD > $O/commit.txt 2>/dev/null; git status --short >> $O/commit.txt 2>/dev/null
LOOM_GPU_KERNEL_TESTS=linear timeout 150 $LB/tests/gpu/gpu_kernel_tests > $O/kernel_tests.log 2>&1; echo "kernel tests rc $?" | tee $O/run.log
grep -E "^FAIL|passed|failed" $O/kernel_tests.log | tail -12 | tee -a $O/run.log
grep -E "bulk" $O/kernel_tests.log | grep -c "^PASS" | sed 's/^/bulk PASS lines: /' | tee -a $O/run.log
timeout 70 $LB/bench/gpu/gpu_bench $O/quant_m1.json --quant-m 1 > $O/quant_m1.txt 2>&1; echo "gpu_bench rc $?" | tee -a $O/run.log
grep -E "^    chained" $O/quant_m1.txt | tee -a $O/run.log
for b in 0 1 0 1; do
  LOOM_CUDA_QGEMV_BULK=$b timeout 100 loom bench configs/gpu/llama3-8b-int8-w8a16.yaml --num-requests 3 --input-len 128 \
    --output-len 256 --set scheduler.max_num_seqs=1 --no-progress --json $O/w8a16-bulk$b.json > $O/w8a16-bulk$b.txt 2>&1
  echo "W8A16 batch 1, bulk $b: $(grep -E 'TPOT p50' $O/w8a16-bulk$b.txt | tr -s ' ')" | tee -a $O/run.log
done
NCU=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu /usr/local/cuda/bin/ncu 2>/dev/null | head -1)
ids=$(seq -s ' ' 1 20)
LOOM_CUDA_QGEMV_BULK=1 timeout 200 "$NCU" --clock-control none --cache-control none --metrics gpu__time_duration.sum --csv \
  --launch-skip 1500 --launch-count 700 $LB/tests/e2e/engine_tool greedy-ids configs/gpu/llama3-8b-int8-w8a16.yaml 40 \
  "$ids" --set backend.cuda_graphs=false > $O/ncu-w8a16-bulk.csv 2> $O/ncu.err
echo "ncu rc $?" | tee -a $O/run.log
python3 scripts/ncu-summary.py $O/ncu-w8a16-bulk.csv > $O/sum-w8a16-bulk.txt 2>&1; head -30 $O/sum-w8a16-bulk.txt | tee -a $O/run.log
xz -f $O/ncu-w8a16-bulk.csv
