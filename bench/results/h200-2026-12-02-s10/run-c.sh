#!/bin/bash
# Session 10, device call C: the engine at batch 1 (3 requests of 128 in,
# 256 out, one sequence at a time) with early weight loads on (the
# default): bf16; W8A16 with its LM head quantized on the CUDA-core GEMV,
# with only matrices of 50 MiB and up (gate|up, down, the head) on
# qgemv_bulk.cu's kernel, and with every one-row GEMV on it; FP8; INT4 with
# its LM head quantized (configs/gpu/llama3-8b-int4-head.yaml, first run);
# bf16 again (drift). Lands in $OUT/c.tar.xz.
set -u
. scripts/gpu-env.sh
O=/tmp/s10c; mkdir -p $O
finish() { tar -cJf $OUT/c.tar.xz -C /tmp s10c; }
trap finish EXIT
git rev-parse HEAD > $O/commit.txt 2>/dev/null; git status --short >> $O/commit.txt 2>/dev/null
b1="--num-requests 3 --input-len 128 --output-len 256 --set scheduler.max_num_seqs=1 --no-progress"
run() { # name config [env...]
  local n=$1 c=$2; shift 2
  env "$@" timeout 170 loom bench configs/gpu/$c.yaml $b1 --json $O/$n.json > $O/$n.txt 2>&1
  echo "$n ($c $*): rc $? $(grep -E 'TPOT p50' $O/$n.txt | tr -s ' ') $(grep -E 'output tokens/s' $O/$n.txt | tr -s ' ')" | tee -a $O/run.log
}
run bf16 llama3-8b-dummy
run w8a16-head llama3-8b-int8-w8a16-head LOOM_CUDA_QGEMV_BULK=0
run w8a16-head-bulk50 llama3-8b-int8-w8a16-head LOOM_CUDA_QGEMV_BULK=1 LOOM_CUDA_QGEMV_BULK_MIN_MB=50
run w8a16-head-bulkall llama3-8b-int8-w8a16-head LOOM_CUDA_QGEMV_BULK=1
run fp8 llama3-8b-fp8 LOOM_CUDA_QGEMV_BULK=0
run bf16-again llama3-8b-dummy
run int4-head llama3-8b-int4-head LOOM_CUDA_QGEMV_BULK=0
