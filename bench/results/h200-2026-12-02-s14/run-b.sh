#!/bin/bash
# Session 14, device call B (tree a48987b + the awq stage): AWQ / GPTQ /
# GPTQ-v2 checkpoints on cuda against transformers (scripts/gpu-check.sh
# awq); loom serve on the H200 (bench/serve_sweep.sh, Llama-3-8B shape, 64
# requests of 128 + 128 tokens at 4 / 16 / inf requests a second) and the
# same workload offline (loom bench); INT4 with its LM head quantized at
# batch 1 against bf16. Lands in $OUT/b.tar.xz (run.log also in $OUT).
set -u
. scripts/gpu-env.sh
O=/tmp/s14b; mkdir -p $O
finish() { tar -cJf $OUT/b.tar.xz -C /tmp s14b; }
trap finish EXIT
log() { echo "$(date +%T) $*" | tee -a $O/run.log $OUT/run.log; }
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,memory.total --format=csv > $O/device.txt 2>&1
mkdir -p $O/awq
OUT=$O/awq timeout 240 scripts/gpu-check.sh awq > $O/awq/awq.txt 2>&1
log "gpu-check awq rc $?"; grep -E "PASS|FAIL|DIFF|failed" $O/awq/awq.txt | tee -a $O/run.log $OUT/run.log
SERVE_N=64 timeout 200 bench/serve_sweep.sh configs/gpu/llama3-8b-dummy.yaml $O/serve 4 16 inf > $O/serve.txt 2>&1
log "serve_sweep rc $?"; grep -E "rate|output tok/s|TTFT|TPOT" $O/serve/summary.txt | tee -a $O/run.log $OUT/run.log
timeout 90 loom bench configs/gpu/llama3-8b-dummy.yaml --num-requests 64 --input-len 128 --output-len 128 \
  --no-progress --json $O/offline-64.json > $O/offline-64.txt 2>&1
log "offline 64 rc $? $(grep -E 'output tok/s|output tokens/s' $O/offline-64.txt | head -2 | tr -s ' ')"
b1="--num-requests 3 --input-len 128 --output-len 256 --set scheduler.max_num_seqs=1 --no-progress"
for c in llama3-8b-dummy llama3-8b-int4-head; do
  timeout 200 loom bench configs/gpu/$c.yaml $b1 --json $O/$c.json > $O/$c.txt 2>&1
  log "$c: rc $? $(grep -E 'TPOT p50' $O/$c.txt | tr -s ' ')"
done
