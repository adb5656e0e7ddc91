#!/usr/bin/env bash
# call 2: the first half of the SmolLM2 GGUF to /tmp (the machine stays warm); the backend test meanwhile
set -u
mkdir -p /tmp/o3
exec > >(tee /tmp/o3/log.txt) 2>&1
cp .devmodel/smollm2.part.00 /tmp/ && ls -la /tmp/smollm2.part.*
. scripts/gpu/gpu-env.sh
( time timeout 400 "$LB/tests/gpu/gpu_backend_test" "$LB/plugins/backend/cuda/loom-backend-cuda.so" \
    "$LB/plugins/backend/cpu/loom-backend-cpu.so" > /tmp/o3/backend.txt 2>&1 ); echo "backend rc=$?"
grep -E "^FAIL" /tmp/o3/backend.txt | head -20
tail -3 /tmp/o3/backend.txt
cd /tmp/o3 && tar czf $OUT/all.tgz . && ls -la $OUT
