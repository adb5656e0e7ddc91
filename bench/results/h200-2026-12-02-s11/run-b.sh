#!/bin/bash
# Session 11, device call B: the pair epilogues (RoPE + KV write fused into
# the QKV GEMV, SwiGLU into the gate|up GEMV, for one-token steps). One
# whole decode layer, unfused and fused, every format (gpu_bench --layer
# 256); the engine at batch 1 with LOOM_CUDA_FUSE_EPILOGUE=1 / 0 (the step
# as before) alternated in one machine; then every GPU test. Lands in
# $OUT/b.tar.xz (run.log also in $OUT as it goes).
set -u
. scripts/gpu-env.sh
O=/tmp/s11b; mkdir -p $O
finish() { tar -cJf $OUT/b.tar.xz -C /tmp s11b; }
trap finish EXIT
log() { echo "$*" | tee -a $O/run.log $OUT/run.log; }
git rev-parse HEAD > $O/commit.txt 2>/dev/null; git status --short >> $O/commit.txt 2>/dev/null
timeout 90 $LB/bench/gpu/gpu_bench $O/layer.json --layer 256 > $O/layer.txt 2>&1
log "layer bench rc $?"; grep -E "a layer|ERROR" $O/layer.txt | tee -a $O/run.log $OUT/run.log
b1="--num-requests 3 --input-len 128 --output-len 256 --set scheduler.max_num_seqs=1 --no-progress"
for c in llama3-8b-dummy llama3-8b-int8-w8a16-head llama3-8b-fp8; do
  for fuse in 1 0; do
    f=$O/$c-fuse$fuse
    LOOM_CUDA_FUSE_EPILOGUE=$fuse timeout 90 loom bench configs/gpu/$c.yaml $b1 --json $f.json > $f.txt 2>&1
    log "$c fuse $fuse: rc $? $(grep -E 'TPOT p50' $f.txt | tr -s ' ')"
  done
done
timeout 200 $LB/tests/gpu/gpu_kernel_tests > $O/kernel_tests.log 2>&1
log "gpu_kernel_tests rc $?"; grep -E "^FAIL|passed|failed" $O/kernel_tests.log | tail -8 | tee -a $O/run.log $OUT/run.log
timeout 150 $LB/tests/gpu/gpu_backend_test $LB/plugins/backend/cuda/loom-backend-cuda.so \
  $LB/plugins/backend/cpu/loom-backend-cpu.so > $O/backend_test.log 2>&1
log "gpu_backend_test rc $?"; grep -E "^FAIL|passed|failed" $O/backend_test.log | tail -8 | tee -a $O/run.log $OUT/run.log
grep -E "pair epilogue" $O/kernel_tests.log | head -80 > $O/pair_epilogue_tests.txt
xz -f $O/kernel_tests.log $O/backend_test.log
