#!/bin/bash
# Session 10, device call D: the engine at batch 1 with this session's
# kernels (early weight loads, peeled first pass; commit ce88f5d) against
# the session's starting point (54a8624: its loom-backend-cuda.so, built
# here from that commit with the same options, carried as
# .devpack/old-backend-cuda.so.xz and swapped into a copy of the plugin
# directory), in one machine: bf16, W8A16 with its LM head quantized, FP8,
# alternated new / old. Lands in $OUT/d.tar.xz (run.log also in $OUT as
# it goes, should the call be cut short).
set -u
. scripts/gpu-env.sh
O=/tmp/s10d; mkdir -p $O
finish() { tar -cJf $OUT/d.tar.xz -C /tmp s10d; }
trap finish EXIT
git rev-parse HEAD > $O/commit.txt 2>/dev/null; git status --short >> $O/commit.txt 2>/dev/null
mkdir -p /tmp/oldplugins && cp -a "$LB/plugins/." /tmp/oldplugins/
xz -dc .devpack/old-backend-cuda.so.xz > /tmp/oldplugins/backend/cuda/loom-backend-cuda.so
b1="--num-requests 3 --input-len 128 --output-len 256 --set scheduler.max_num_seqs=1 --no-progress"
run() { # name config plugin-dir
  LOOM_PLUGIN_PATH=$3 timeout 90 loom bench configs/gpu/$2.yaml $b1 --json $O/$1.json > $O/$1.txt 2>&1
  echo "$1: rc $? $(grep -E 'TPOT p50' $O/$1.txt | tr -s ' ') $(grep -E 'output tokens/s' $O/$1.txt | tr -s ' ')" | tee -a $O/run.log $OUT/run.log
}
run bf16-new llama3-8b-dummy "$LB/plugins"
run bf16-old llama3-8b-dummy /tmp/oldplugins
run w8a16-head-new llama3-8b-int8-w8a16-head "$LB/plugins"
run w8a16-head-old llama3-8b-int8-w8a16-head /tmp/oldplugins
run fp8-new llama3-8b-fp8 "$LB/plugins"
run fp8-old llama3-8b-fp8 /tmp/oldplugins
