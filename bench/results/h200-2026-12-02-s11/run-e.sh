#!/bin/bash
# Session 11, device call E (the last ~5 minutes of device time): attention
# stages the keys already in the cache before its programmatic-launch wait
# (loom_cuda_attn_tile.kv_ready; LOOM_CUDA_ATTN_EARLY_KV=0 waits first), and
# the review's fixes to the pair epilogues (no fusing into a one-row chunk of
# a longer call). The attention tests (each also early vs late, bit for
# bit), the pair-epilogue tests (new: declined shapes), gpu_backend_test,
# then the engine at batch 1 (bf16) with early K/V on / off. Lands in
# $OUT/e.tar.xz (run.log also in $OUT as it goes).
set -u
. scripts/gpu-env.sh
O=/tmp/s11e; mkdir -p $O
finish() { tar -cJf $OUT/e.tar.xz -C /tmp s11e; }
trap finish EXIT
log() { echo "$*" | tee -a $O/run.log $OUT/run.log; }
git rev-parse HEAD > $O/commit.txt 2>/dev/null; git status --short >> $O/commit.txt 2>/dev/null
for t in attention epilogue; do
  LOOM_GPU_KERNEL_TESTS=$t timeout 70 $LB/tests/gpu/gpu_kernel_tests > $O/kernel_tests_$t.log 2>&1
  log "gpu_kernel_tests ($t) rc $?"; grep -E "^FAIL|passed|failed" $O/kernel_tests_$t.log | tail -6 | tee -a $O/run.log $OUT/run.log
done
timeout 110 $LB/tests/gpu/gpu_backend_test $LB/plugins/backend/cuda/loom-backend-cuda.so \
  $LB/plugins/backend/cpu/loom-backend-cpu.so > $O/backend_test.log 2>&1
log "gpu_backend_test rc $?"; grep -E "^FAIL|passed|failed" $O/backend_test.log | tail -6 | tee -a $O/run.log $OUT/run.log
b1="--num-requests 3 --input-len 128 --output-len 256 --set scheduler.max_num_seqs=1 --no-progress"
for ek in 1 0; do
  f=$O/llama3-8b-dummy-earlykv$ek
  LOOM_CUDA_ATTN_EARLY_KV=$ek timeout 50 loom bench configs/gpu/llama3-8b-dummy.yaml $b1 --json $f.json > $f.txt 2>&1
  log "llama3-8b-dummy early K/V $ek: rc $? $(grep -E 'TPOT p50' $f.txt | tr -s ' ')"
done
xz -f $O/*.log 2>/dev/null; cp $OUT/run.log $O/run.log 2>/dev/null
