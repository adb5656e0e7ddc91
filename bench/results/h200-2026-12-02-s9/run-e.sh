#!/bin/bash
# Session 9, device call E: the review fixes (qgemv_bulk.cu: static_assert,
# the consumers' redundant PDL trigger dropped, the layout's unused maxima;
# tests: several stages a tile with many tiles a CTA, INT4 g2048 at 4
# warps): the linear-layer GPU tests. Lands in $OUT/e.tar.xz.
set -u
. scripts/gpu-env.sh
O=/tmp/s9e; mkdir -p $O
finish() { tar -cJf $OUT/e.tar.xz -C /tmp s9e; }
trap finish EXIT
LOOM_GPU_KERNEL_TESTS=linear timeout 150 $LB/tests/gpu/gpu_kernel_tests > $O/kernel_tests.log 2>&1; echo "kernel tests rc $?" | tee $O/run.log
grep -E "^FAIL|passed|failed" $O/kernel_tests.log | tail -12 | tee -a $O/run.log
grep -E "bulk" $O/kernel_tests.log | grep -c "^PASS" | sed 's/^/bulk PASS lines: /' | tee -a $O/run.log
xz -f $O/kernel_tests.log
