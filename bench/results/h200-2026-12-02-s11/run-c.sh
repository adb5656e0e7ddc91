#!/bin/bash
# Session 11, device call C: which pair epilogue pays for which format (call
# B: fused was faster for bf16 / FP8 / W8A8 and slower for W8A16 / INT4).
# One whole decode layer with RoPE, SwiGLU or both fused, every format
# (gpu_bench --layer 256); the engine at batch 1 with
# LOOM_CUDA_FUSE_EPILOGUE=1 / 0 / rope / swiglu alternated in one machine.
# Lands in $OUT/c.tar.xz (run.log also in $OUT as it goes).
set -u
. scripts/gpu-env.sh
O=/tmp/s11c; mkdir -p $O
finish() { tar -cJf $OUT/c.tar.xz -C /tmp s11c; }
trap finish EXIT
log() { echo "$*" | tee -a $O/run.log $OUT/run.log; }
git rev-parse HEAD > $O/commit.txt 2>/dev/null; git status --short >> $O/commit.txt 2>/dev/null
timeout 120 $LB/bench/gpu/gpu_bench $O/layer.json --layer 256 > $O/layer.txt 2>&1
log "layer bench rc $?"; grep -E "a layer|ERROR" $O/layer.txt | tee -a $O/run.log $OUT/run.log
b1="--num-requests 3 --input-len 128 --output-len 256 --set scheduler.max_num_seqs=1 --no-progress"
run() { # config fuse
  f=$O/$1-fuse$2
  LOOM_CUDA_FUSE_EPILOGUE=$2 timeout 90 loom bench configs/gpu/$1.yaml $b1 --json $f.json > $f.txt 2>&1
  log "$1 fuse $2: rc $? $(grep -E 'TPOT p50' $f.txt | tr -s ' ')"
}
run llama3-8b-int8-w8a16-head 0; run llama3-8b-int8-w8a16-head rope; run llama3-8b-int8-w8a16-head swiglu
run llama3-8b-int8-w8a16-head 1; run llama3-8b-int8-w8a16-head 0
run llama3-8b-dummy 1; run llama3-8b-dummy 0
run llama3-8b-fp8 1; run llama3-8b-fp8 0
