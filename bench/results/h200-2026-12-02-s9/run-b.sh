#!/bin/bash
# Session 9, device call B: qgemv_bulk.cu with the token prepared per
# consumer warp (its own columns, its own power-of-two scale: no CTA
# barrier), the producer releasing the next kernels' launch at once (PDL),
# and the subnormal decodes of int8 / int4 codes (switchable): the
# linear-layer GPU tests, one Llama-3-8B layer's linears chained at M = 1,
# and the engine at batch 1 with the kernel on (bf16 vs W8A16, W8A16 with
# its LM head quantized, FP8, INT4). Lands in $OUT/b.tar.xz.
set -u
. scripts/gpu-env.sh
O=/tmp/s9b; mkdir -p $O
finish() { tar -cJf $OUT/b.tar.xz -C /tmp s9b; }
trap finish EXIT
git rev-parse HEAD > $O/commit.txt 2>/dev/null; git status --short >> $O/commit.txt 2>/dev/null
LOOM_GPU_KERNEL_TESTS=linear timeout 150 $LB/tests/gpu/gpu_kernel_tests > $O/kernel_tests.log 2>&1; echo "kernel tests rc $?" | tee $O/run.log
grep -E "^FAIL|passed|failed" $O/kernel_tests.log | tail -12 | tee -a $O/run.log
grep -E "bulk" $O/kernel_tests.log | grep -c "^PASS" | sed 's/^/bulk PASS lines: /' | tee -a $O/run.log
timeout 70 $LB/bench/gpu/gpu_bench $O/quant_m1.json --quant-m 1 > $O/quant_m1.txt 2>&1; echo "gpu_bench rc $?" | tee -a $O/run.log
grep -E "^    chained" $O/quant_m1.txt | tee -a $O/run.log
LOOM_CUDA_QGEMV_BULK=1 OUT=$O QUANT_SCHEMES="int8-w8a16 int8-w8a16-head fp8 int4" QUANT_RUNS="b1" timeout 330 scripts/gpu-check.sh quant > $O/quant_bulk.log 2>&1
grep -E "===|output tokens/s|TPOT" $O/quant_bulk.log | tee -a $O/run.log
