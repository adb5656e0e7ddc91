#!/bin/bash
# Session 12, device call B: split auto by default, SwiGLU fused before
# every non-GGUF down projection, and the experiment of asking L2 for each
# next pass of a GEMV's rows (LOOM_CUDA_QGEMV_PF_NEXT). Linear-layer kernel
# tests with the prefetch on; one decode layer per format with it off / on
# (and W8A16's linears left out in turn); the engine at batch 1: W8A16 +
# quantized LM head prefetch off / on alternated, bf16, FP8 off / on, INT4 +
# quantized LM head. Lands in $OUT/b.tar.xz (run.log also in $OUT).
set -u
. scripts/gpu-env.sh
O=/tmp/s12b; mkdir -p $O
finish() { tar -cJf $OUT/b.tar.xz -C /tmp s12b; }
trap finish EXIT
log() { echo "$*" | tee -a $O/run.log $OUT/run.log; }
LOOM_CUDA_QGEMV_PF_NEXT=1 LOOM_GPU_KERNEL_TESTS=linear timeout 240 $LB/tests/gpu/gpu_kernel_tests > $O/kernel_tests_linear_pfn.log 2>&1
log "gpu_kernel_tests linear (pf-next on) rc $?"; grep -E "^FAIL|passed|failed" $O/kernel_tests_linear_pfn.log | tail -12 | tee -a $O/run.log $OUT/run.log
timeout 200 $LB/bench/gpu/gpu_bench $O/layer.json --layer 256 > $O/layer.txt 2>&1
log "layer rc $?"; grep -E "a layer" $O/layer.txt | tee -a $O/run.log $OUT/run.log
b1="--num-requests 3 --input-len 128 --output-len 256 --set scheduler.max_num_seqs=1 --no-progress"
run() { # config pf-next [timeout]
  f=$O/$1-pfn$2
  LOOM_CUDA_QGEMV_PF_NEXT=$2 timeout ${3:-90} loom bench configs/gpu/$1.yaml $b1 --json $f.json > $f.txt 2>&1
  log "$1 pf-next $2: rc $? $(grep -E 'TPOT p50' $f.txt | tr -s ' ')"
}
run llama3-8b-dummy 0
for i in 1 2; do run llama3-8b-int8-w8a16-head 0; run llama3-8b-int8-w8a16-head 1; done
run llama3-8b-fp8 0; run llama3-8b-fp8 1
run llama3-8b-int4-head 0 170
xz -f $O/kernel_tests_linear_pfn.log
