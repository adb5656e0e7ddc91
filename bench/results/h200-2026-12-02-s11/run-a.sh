#!/bin/bash
# Session 11, device call A: session 10's final kernels (0599dcd, never run
# on a GPU) through every GPU test; one whole decode layer in a CUDA graph
# (gpu_bench --layer 256: every format; bf16 with each small kernel left
# out); the engine at batch 1 (bf16, W8A16 with its LM head quantized, FP8)
# with the backend's step split logged (LOOM_LOG_LEVEL=info). Lands in
# $OUT/a.tar.xz (run.log also in $OUT as it goes).
set -u
. scripts/gpu-env.sh
O=/tmp/s11a; mkdir -p $O
finish() { tar -cJf $OUT/a.tar.xz -C /tmp s11a; }
trap finish EXIT
log() { echo "$*" | tee -a $O/run.log $OUT/run.log; }
git rev-parse HEAD > $O/commit.txt 2>/dev/null; git status --short >> $O/commit.txt 2>/dev/null
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv > $O/device.txt
timeout 60 $LB/bench/gpu/gpu_bench $O/layer.json --layer 256 > $O/layer.txt 2>&1
log "layer bench rc $?"; grep -E "a layer|ERROR" $O/layer.txt | tee -a $O/run.log $OUT/run.log
b1="--num-requests 3 --input-len 128 --output-len 256 --set scheduler.max_num_seqs=1 --no-progress"
for c in llama3-8b-dummy llama3-8b-int8-w8a16-head llama3-8b-fp8; do
  LOOM_LOG_LEVEL=info timeout 90 loom bench configs/gpu/$c.yaml $b1 --json $O/$c.json > $O/$c.txt 2>&1
  log "$c: rc $? $(grep -E 'TPOT p50' $O/$c.txt | tr -s ' ') | $(grep -E 'ms a step' $O/$c.txt | tail -1 | sed 's/.*steps/steps/')"
done
timeout 150 $LB/tests/gpu/gpu_kernel_tests > $O/kernel_tests.log 2>&1
log "gpu_kernel_tests rc $?"; grep -E "^FAIL|passed|failed" $O/kernel_tests.log | tail -8 | tee -a $O/run.log $OUT/run.log
timeout 150 $LB/tests/gpu/gpu_backend_test > $O/backend_test.log 2>&1
log "gpu_backend_test rc $?"; grep -E "^FAIL|passed|failed" $O/backend_test.log | tail -8 | tee -a $O/run.log $OUT/run.log
xz -f $O/kernel_tests.log $O/backend_test.log
