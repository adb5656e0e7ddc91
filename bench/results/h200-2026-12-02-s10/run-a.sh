#!/bin/bash
# Session 10, device call A: the CUDA-core GEMVs (gemv.cu bf16 / f16,
# qgemm.cu W8A16 / W8A8 / FP8 / INT4) loading their first weight chunks
# into registers before the programmatic-launch wait (lc_early_weights):
# every GPU kernel test (new: early vs late loads bit for bit),
# gpu_backend_test, gpu_bench --quant-m 1 (chained and mixed, with `_late`
# rows: early loads off), and the engine at batch 1, bf16 vs W8A16 with its
# LM head quantized, early loads on and off. Lands in $OUT/a.tar.xz.
set -u
. scripts/gpu-env.sh
O=/tmp/s10a; mkdir -p $O
finish() { tar -cJf $OUT/a.tar.xz -C /tmp s10a; }
trap finish EXIT
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,memory.total --format=csv > $O/device.txt 2>&1
git rev-parse HEAD > $O/commit.txt 2>/dev/null; git status --short >> $O/commit.txt 2>/dev/null
timeout 200 $LB/tests/gpu/gpu_kernel_tests > $O/kernel_tests.log 2>&1; echo "kernel tests rc $?" | tee $O/run.log
grep -E "^FAIL|passed|failed" $O/kernel_tests.log | tail -12 | tee -a $O/run.log
grep -E "early loads" $O/kernel_tests.log | grep -c "^PASS" | sed 's/^/early-vs-late PASS lines: /' | tee -a $O/run.log
timeout 120 $LB/bench/gpu/gpu_bench $O/quant_m1.json --quant-m 1 > $O/quant_m1.txt 2>&1; echo "gpu_bench rc $?" | tee -a $O/run.log
grep -E "^    (chained|mixed)" $O/quant_m1.txt | tee -a $O/run.log
for e in 1 0; do
  LOOM_CUDA_EARLY_WEIGHTS=$e timeout 150 loom bench --compare configs/gpu/llama3-8b-dummy.yaml configs/gpu/llama3-8b-int8-w8a16-head.yaml \
    --num-requests 3 --input-len 128 --output-len 256 --set scheduler.max_num_seqs=1 --no-progress \
    --json $O/w8a16-head-early$e.json > $O/w8a16-head-early$e.txt 2>&1; echo "compare early=$e rc $?" | tee -a $O/run.log
  grep -E "output tokens/s|TPOT p50" $O/w8a16-head-early$e.txt | tee -a $O/run.log
done
timeout 150 $LB/tests/gpu/gpu_backend_test $LB/plugins/backend/cuda/loom-backend-cuda.so \
  $LB/plugins/backend/cpu/loom-backend-cpu.so > $O/backend_test.log 2>&1; echo "backend test rc $?" | tee -a $O/run.log
grep -E "^FAIL|passed|failed" $O/backend_test.log | tail -6 | tee -a $O/run.log
xz -f $O/kernel_tests.log $O/backend_test.log
