#!/bin/bash
# Session 12, device call A: the one-row quantized GEMV with K split across
# a CTA's warps (qgemm.cu, LOOM_CUDA_QGEMV_SPLIT / lc_qgemv_split_set).
# The linear-layer kernel tests (split 2 / 4 forced and auto against the
# float64 reference); one whole decode layer with each linear left out
# (bf16, W8A16) and every format at split 1 / auto / 2 / 4; the engine at
# batch 1, W8A16 + quantized LM head with split 1 vs auto alternated, bf16
# and FP8 once each. Lands in $OUT/a.tar.xz (run.log also in $OUT).
set -u
. scripts/gpu-env.sh
O=/tmp/s12a; mkdir -p $O
finish() { tar -cJf $OUT/a.tar.xz -C /tmp s12a; }
trap finish EXIT
log() { echo "$*" | tee -a $O/run.log $OUT/run.log; }
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,memory.total --format=csv > $O/device.txt 2>&1
LOOM_GPU_KERNEL_TESTS=linear timeout 240 $LB/tests/gpu/gpu_kernel_tests > $O/kernel_tests_linear.log 2>&1
log "gpu_kernel_tests linear rc $?"; grep -E "^FAIL|passed|failed" $O/kernel_tests_linear.log | tail -12 | tee -a $O/run.log $OUT/run.log
grep -E "split" $O/kernel_tests_linear.log > $O/split_tests.txt
timeout 200 $LB/bench/gpu/gpu_bench $O/layer.json --layer 256 > $O/layer.txt 2>&1
log "layer rc $?"; grep -E "a layer" $O/layer.txt | tee -a $O/run.log $OUT/run.log
b1="--num-requests 3 --input-len 128 --output-len 256 --set scheduler.max_num_seqs=1 --no-progress"
run() { # config split
  f=$O/$1-split$2
  LOOM_CUDA_QGEMV_SPLIT=$2 timeout 90 loom bench configs/gpu/$1.yaml $b1 --json $f.json > $f.txt 2>&1
  log "$1 split $2: rc $? $(grep -E 'TPOT p50' $f.txt | tr -s ' ')"
}
run llama3-8b-dummy auto
for i in 1 2; do run llama3-8b-int8-w8a16-head 1; run llama3-8b-int8-w8a16-head auto; done
run llama3-8b-fp8 1; run llama3-8b-fp8 auto
xz -f $O/kernel_tests_linear.log
