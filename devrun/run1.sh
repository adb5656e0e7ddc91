#!/usr/bin/env bash
# scratch driver for one device call (not committed)
set -u
mkdir -p /tmp/o
exec > >(tee /tmp/o/log.txt) 2>&1
lscpu | grep -E "Model name|Flags" | cut -c1-2000
nvidia-smi --query-gpu=name,clocks.max.sm --format=csv
python3 -c "import torch, transformers; print(torch.__version__, transformers.__version__)"
echo "== MoE references"
( cd devrun && time python3 gen_moe_reference.py /tmp/o/moe_ref 2> /tmp/o/moe_ref.log ); echo "gen rc=$?"
tail -5 /tmp/o/moe_ref.log
du -sh /tmp/o/moe_ref
echo "== GPU kernel tests: attention"
. scripts/gpu/gpu-env.sh
LOOM_GPU_KERNEL_TESTS=attention timeout 300 "$LB/tests/gpu/gpu_kernel_tests" 2>&1 | tail -15
echo "kernel rc=${PIPESTATUS[0]}"
cd /tmp/o && tar czf $OUT/all.tgz . && ls -la $OUT
