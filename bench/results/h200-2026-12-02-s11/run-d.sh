#!/bin/bash
# Session 11, device call D: the final tree — RoPE + KV write fused into
# every one-row QKV GEMV, SwiGLU into the gate|up GEMV only where the down
# projection is bf16 / W8A8 / FP8 (cuda_forward.c: cb_swiglu_fuses). The
# engine at batch 1, default against LOOM_CUDA_FUSE_EPILOGUE=0 (the step as
# before), alternated in one machine; then every GPU test. Lands in
# $OUT/d.tar.xz (run.log also in $OUT as it goes).
set -u
. scripts/gpu-env.sh
O=/tmp/s11d; mkdir -p $O
finish() { tar -cJf $OUT/d.tar.xz -C /tmp s11d; }
trap finish EXIT
log() { echo "$*" | tee -a $O/run.log $OUT/run.log; }
git rev-parse HEAD > $O/commit.txt 2>/dev/null; git status --short >> $O/commit.txt 2>/dev/null
b1="--num-requests 3 --input-len 128 --output-len 256 --set scheduler.max_num_seqs=1 --no-progress"
run() { # config fuse (- = the default)
  f=$O/$1-fuse$2
  if [ "$2" = - ]; then timeout 90 loom bench configs/gpu/$1.yaml $b1 --json $f.json > $f.txt 2>&1
  else LOOM_CUDA_FUSE_EPILOGUE=$2 timeout 90 loom bench configs/gpu/$1.yaml $b1 --json $f.json > $f.txt 2>&1; fi
  log "$1 fuse $2: rc $? $(grep -E 'TPOT p50' $f.txt | tr -s ' ')"
}
for c in llama3-8b-dummy llama3-8b-int8-w8a16-head llama3-8b-fp8; do run $c -; run $c 0; done
timeout 200 $LB/tests/gpu/gpu_kernel_tests > $O/kernel_tests.log 2>&1
log "gpu_kernel_tests rc $?"; grep -E "^FAIL|passed|failed" $O/kernel_tests.log | tail -8 | tee -a $O/run.log $OUT/run.log
timeout 150 $LB/tests/gpu/gpu_backend_test $LB/plugins/backend/cuda/loom-backend-cuda.so \
  $LB/plugins/backend/cpu/loom-backend-cpu.so > $O/backend_test.log 2>&1
log "gpu_backend_test rc $?"; grep -E "^FAIL|passed|failed" $O/backend_test.log | tail -8 | tee -a $O/run.log $OUT/run.log
grep -E "pair epilogue" $O/kernel_tests.log > $O/pair_epilogue_tests.txt
xz -f $O/kernel_tests.log $O/backend_test.log
