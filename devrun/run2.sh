#!/usr/bin/env bash
# call 1: the merged tree's CUDA build: every kernel test and the backend test
set -u
mkdir -p /tmp/o2
exec > >(tee /tmp/o2/log.txt) 2>&1
. scripts/gpu/gpu-env.sh
cat .devpack/commit.txt
echo "== gpu_kernel_tests (all)"
( time timeout 330 "$LB/tests/gpu/gpu_kernel_tests" > /tmp/o2/kernel.txt 2>&1 ); echo "kernel rc=$?"
grep -E "^FAIL|passed, .* failed|logits_topk masked" /tmp/o2/kernel.txt | head -40
echo "== gpu_backend_test"
( time timeout 200 "$LB/tests/gpu/gpu_backend_test" > /tmp/o2/backend.txt 2>&1 ); echo "backend rc=$?"
grep -E "^FAIL|passed, .* failed" /tmp/o2/backend.txt | head -20
tail -3 /tmp/o2/backend.txt
cd /tmp/o2 && tar czf $OUT/all.tgz . && ls -la $OUT
