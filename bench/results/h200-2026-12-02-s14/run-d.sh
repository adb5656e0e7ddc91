#!/bin/bash
# Session 14, device call D (tree of call C): each scheme against bf16 at
# batch 64 and for 2048-token prefills, one `loom bench --compare` each, in
# one machine (call C did batch 1). Lands in $OUT/d.tar.xz.
set -u
. scripts/gpu-env.sh
O=/tmp/s14d; mkdir -p $O
finish() { tar -cJf $OUT/d.tar.xz -C /tmp s14d; }
trap finish EXIT
log() { echo "$(date +%T) $*" | tee -a $O/run.log $OUT/run.log; }
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,memory.total --format=csv > $O/device.txt 2>&1
QUANT_SCHEMES="int8-w8a16-head fp8 int8-w8a8 int4-head" QUANT_RUNS="b64 prefill" OUT=$O timeout 560 \
  scripts/gpu-check.sh quant > $O/quant.txt 2>&1
log "gpu-check quant b64 prefill rc $?"; grep -E "===|TPOT p50|output tokens/s|total tokens/s|FAIL|failed" $O/quant.txt | tee -a $O/run.log $OUT/run.log
