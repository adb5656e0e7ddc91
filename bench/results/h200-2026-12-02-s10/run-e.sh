#!/bin/bash
# Session 10, device call E: W8A16 back on session 9's one-row loop (no
# early loads, L2 prefetch as before; the other formats keep theirs): the
# linear-layer GPU tests, then the engine's W8A16-head batch 1 once. Lands
# in $OUT/e.tar.xz (run.log also in $OUT as it goes).
set -u
. scripts/gpu-env.sh
O=/tmp/s10e; mkdir -p $O
finish() { tar -cJf $OUT/e.tar.xz -C /tmp s10e; }
trap finish EXIT
LOOM_GPU_KERNEL_TESTS=linear timeout 100 $LB/tests/gpu/gpu_kernel_tests > $O/kernel_tests.log 2>&1
echo "linear tests rc $?" | tee -a $O/run.log $OUT/run.log
grep -E "^FAIL|passed|failed" $O/kernel_tests.log | tail -8 | tee -a $O/run.log $OUT/run.log
timeout 50 loom bench configs/gpu/llama3-8b-int8-w8a16-head.yaml --num-requests 3 --input-len 128 --output-len 256 \
  --set scheduler.max_num_seqs=1 --no-progress --json $O/w8a16-head.json > $O/w8a16-head.txt 2>&1
echo "w8a16-head: rc $? $(grep -E 'TPOT p50' $O/w8a16-head.txt | tr -s ' ')" | tee -a $O/run.log $OUT/run.log
xz -f $O/kernel_tests.log
