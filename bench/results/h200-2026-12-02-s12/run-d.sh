#!/bin/bash
# Session 12, device call D: the pair-epilogue tests with the separate
# GEMV pinned unsplit (call C's two f16 failures: the split GEMV sums a
# row's halves in another order than the fused one). Lands in $OUT/d.tar.xz.
set -u
. scripts/gpu-env.sh
O=/tmp/s12d; mkdir -p $O
finish() { tar -cJf $OUT/d.tar.xz -C /tmp s12d; }
trap finish EXIT
LOOM_GPU_KERNEL_TESTS=epilogue timeout 100 $LB/tests/gpu/gpu_kernel_tests > $O/kernel_tests_epilogue.log 2>&1
echo "gpu_kernel_tests epilogue rc $?" | tee -a $O/run.log $OUT/run.log
grep -E "^FAIL|passed|failed" $O/kernel_tests_epilogue.log | tail -8 | tee -a $O/run.log $OUT/run.log
