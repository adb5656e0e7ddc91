#!/bin/bash
# Session 7, device call A: every GPU kernel test on d0f7df7's kernels (not
# yet run on a GPU), the one-row quantized linear layers per shape, and an
# ncu profile (occupancy, stalls, issue, DRAM) of each format's one-row GEMV
# on the four Llama-3-8B shapes. Lands in $OUT/a.tar.xz.
set -u
. scripts/gpu-env.sh
O=/tmp/s7a; mkdir -p $O
finish() { tar -cJf $OUT/a.tar.xz -C /tmp s7a; }
trap finish EXIT
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,power.draw --format=csv > $O/device.txt 2>&1
timeout 150 $LB/tests/gpu/gpu_kernel_tests > $O/kernel_tests.log 2>&1; echo "kernel tests rc $?" | tee $O/run.log
grep -E "^FAIL|passed|failed" $O/kernel_tests.log | tail -12 | tee -a $O/run.log
timeout 60 $LB/bench/gpu/gpu_bench $O/quant_m1.json --quant-m 1 > $O/quant_m1.txt 2>&1
grep -E "us per layer" $O/quant_m1.txt | tee -a $O/run.log
NCU=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu /usr/local/cuda/bin/ncu 2>/dev/null | head -1)
echo "ncu: $NCU" | tee -a $O/run.log
LOOM_BENCH_REPS=1 timeout 240 "$NCU" --clock-control none --kernel-name-base demangled \
  -k 'regex:lc_q?gemv_kernel<__nv_bfloat16, ([0-4], )?1, [12],' \
  --section SpeedOfLight --section Occupancy --section LaunchStats --section WarpStateStats \
  --section SchedulerStats --section MemoryWorkloadAnalysis --section ComputeWorkloadAnalysis \
  --csv --page details $LB/bench/gpu/gpu_bench $O/ncu_bench.json --quant-m 1 > $O/ncu.csv 2> $O/ncu.err
echo "ncu rc $? lines $(wc -l < $O/ncu.csv)" | tee -a $O/run.log
tail -3 $O/ncu.err
