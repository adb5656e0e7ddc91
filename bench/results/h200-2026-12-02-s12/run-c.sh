#!/bin/bash
# Session 12, device call C: the final tree — K split in two for one-row
# GEMVs whose unsplit grid leaves the GPU short of a wave (auto), SwiGLU
# fused into the gate|up GEMV before every non-GGUF down projection, no
# next-pass prefetch (call B: slower). The linear-layer kernel tests,
# gpu_backend_test, and the engine at batch 1: bf16, W8A16 + quantized LM
# head split 1 / auto alternated, FP8. Lands in $OUT/c.tar.xz.
set -u
. scripts/gpu-env.sh
O=/tmp/s12c; mkdir -p $O
finish() { tar -cJf $OUT/c.tar.xz -C /tmp s12c; }
trap finish EXIT
log() { echo "$(date +%T) $*" | tee -a $O/run.log $OUT/run.log; }
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,memory.total --format=csv > $O/device.txt 2>&1
b1="--num-requests 3 --input-len 128 --output-len 256 --set scheduler.max_num_seqs=1 --no-progress"
run() { # config split
  f=$O/$1-split$2-$3
  LOOM_CUDA_QGEMV_SPLIT=$2 timeout 90 loom bench configs/gpu/$1.yaml $b1 --json $f.json > $f.txt 2>&1
  log "$1 split $2: rc $? $(grep -E 'TPOT p50' $f.txt | tr -s ' ')"
}
run llama3-8b-dummy auto 1
for i in 1 2; do run llama3-8b-int8-w8a16-head 1 $i; run llama3-8b-int8-w8a16-head auto $i; done
run llama3-8b-fp8 auto 1
LOOM_GPU_KERNEL_TESTS=linear timeout 150 $LB/tests/gpu/gpu_kernel_tests > $O/kernel_tests_linear.log 2>&1
log "gpu_kernel_tests linear rc $?"; grep -E "^FAIL|passed|failed" $O/kernel_tests_linear.log | tail -12 | tee -a $O/run.log $OUT/run.log
grep -E "split" $O/kernel_tests_linear.log > $O/split_tests.txt
timeout 150 $LB/tests/gpu/gpu_backend_test $LB/plugins/backend/cuda/loom-backend-cuda.so \
  $LB/plugins/backend/cpu/loom-backend-cpu.so > $O/backend_test.log 2>&1
log "gpu_backend_test rc $?"; grep -E "^FAIL|passed|failed" $O/backend_test.log | tail -8 | tee -a $O/run.log $OUT/run.log
xz -f $O/kernel_tests_linear.log $O/backend_test.log
