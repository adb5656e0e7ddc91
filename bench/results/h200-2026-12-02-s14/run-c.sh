#!/bin/bash
# Session 14, device call C (tree of call B + the awq stage's cpu config):
# the awq stage's tiny checkpoints again (cuda and cpu), then each scheme
# against bf16 at batch 1 in one `loom bench --compare` each, all in one
# machine: W8A16 and INT4 with their LM heads quantized, FP8, W8A8.
# Lands in $OUT/c.tar.xz (run.log also in $OUT).
set -u
. scripts/gpu-env.sh
O=/tmp/s14c; mkdir -p $O/awq $O/quant
finish() { tar -cJf $OUT/c.tar.xz -C /tmp s14c; }
trap finish EXIT
log() { echo "$(date +%T) $*" | tee -a $O/run.log $OUT/run.log; }
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,memory.total --format=csv > $O/device.txt 2>&1
AWQ_SHAPES=tiny OUT=$O/awq timeout 100 scripts/gpu-check.sh awq > $O/awq/awq.txt 2>&1
log "gpu-check awq (tiny) rc $?"; grep -E "PASS|FAIL|DIFF|failed" $O/awq/awq.txt | tee -a $O/run.log $OUT/run.log
QUANT_SCHEMES="int8-w8a16-head fp8 int8-w8a8 int4-head" QUANT_RUNS=b1 OUT=$O/quant timeout 470 \
  scripts/gpu-check.sh quant > $O/quant/quant.txt 2>&1
log "gpu-check quant b1 rc $?"; grep -E "===|TPOT p50|output tokens/s|FAIL|failed" $O/quant/quant.txt | tee -a $O/run.log $OUT/run.log
