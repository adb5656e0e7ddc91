#!/bin/bash
# Session 14, device call F (binaries of a48987b, configs of this tree): FP8
# with its LM head quantized too (configs/gpu/llama3-8b-fp8-head.yaml)
# against bf16 and plain FP8 at batch 1, one `loom bench --compare` each.
# Lands in $OUT/f/.
set -u
. scripts/gpu-env.sh
mkdir -p $OUT/f
b1="--num-requests 3 --input-len 128 --output-len 256 --set scheduler.max_num_seqs=1 --no-progress"
timeout 120 loom bench --compare configs/gpu/llama3-8b-dummy.yaml configs/gpu/llama3-8b-fp8-head.yaml $b1 \
  --json $OUT/f/bf16-vs-fp8-head.json > $OUT/f/bf16-vs-fp8-head.txt 2>&1
echo "bf16 vs fp8-head rc $?"; grep -E "output tokens/s|TPOT p50" $OUT/f/bf16-vs-fp8-head.txt
timeout 100 loom bench --compare configs/gpu/llama3-8b-fp8.yaml configs/gpu/llama3-8b-fp8-head.yaml $b1 \
  --json $OUT/f/fp8-vs-fp8-head.json > $OUT/f/fp8-vs-fp8-head.txt 2>&1
echo "fp8 vs fp8-head rc $?"; grep -E "output tokens/s|TPOT p50" $OUT/f/fp8-vs-fp8-head.txt
