#!/bin/bash
# Session 14, device call A (tree a48987b): what session 12's review and
# session 13 left un-run on a GPU — the linear and pair-epilogue kernel
# tests (the pair bit-equality test now pins its separate GEMV unsplit; the
# opt-in split of the pair GEMV), gpu_backend_test — and the engine at
# batch 1: bf16, W8A16 + quantized LM head and FP8 with the pair GEMV's
# split off / on (LOOM_CUDA_QGEMV_SPLIT_PAIR=0 / 1) alternated.
# Lands in $OUT/a.tar.xz (run.log also in $OUT).
set -u
. scripts/gpu-env.sh
O=/tmp/s14a; mkdir -p $O
finish() { tar -cJf $OUT/a.tar.xz -C /tmp s14a; }
trap finish EXIT
log() { echo "$(date +%T) $*" | tee -a $O/run.log $OUT/run.log; }
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,memory.total --format=csv > $O/device.txt 2>&1
git log -1 --format=%H > $O/commit.txt 2>/dev/null
b1="--num-requests 3 --input-len 128 --output-len 256 --set scheduler.max_num_seqs=1 --no-progress"
run() { # config pair-split tag
  f=$O/$1-pair$2-$3
  LOOM_CUDA_QGEMV_SPLIT_PAIR=$2 timeout 90 loom bench configs/gpu/$1.yaml $b1 --json $f.json > $f.txt 2>&1
  log "$1 pair split $2: rc $? $(grep -E 'TPOT p50' $f.txt | tr -s ' ')"
}
run llama3-8b-dummy 0 1
for i in 1 2; do run llama3-8b-int8-w8a16-head 0 $i; run llama3-8b-int8-w8a16-head 1 $i; done
run llama3-8b-fp8 0 1; run llama3-8b-fp8 1 1
for t in epilogue linear; do
  LOOM_GPU_KERNEL_TESTS=$t timeout 150 $LB/tests/gpu/gpu_kernel_tests > $O/kernel_tests_$t.log 2>&1
  log "gpu_kernel_tests $t rc $?"; grep -E "^FAIL|passed|failed" $O/kernel_tests_$t.log | tail -12 | tee -a $O/run.log $OUT/run.log
done
grep -E "split|pair" $O/kernel_tests_linear.log $O/kernel_tests_epilogue.log > $O/split_pair_tests.txt
timeout 120 $LB/tests/gpu/gpu_backend_test $LB/plugins/backend/cuda/loom-backend-cuda.so \
  $LB/plugins/backend/cpu/loom-backend-cpu.so > $O/backend_test.log 2>&1
log "gpu_backend_test rc $?"; grep -E "^FAIL|passed|failed" $O/backend_test.log | tail -8 | tee -a $O/run.log $OUT/run.log
xz -f $O/kernel_tests_*.log $O/backend_test.log
