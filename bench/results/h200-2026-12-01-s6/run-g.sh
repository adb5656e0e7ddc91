#!/bin/bash
# Session 6, device call G: every GPU kernel test on the tree after the
# review fixes (scratch poisoned before the fused paths, 2-chunk and
# >= 128-row cases, batch invariance past 128 rows, the scale-vector path
# asserted on the 8B shape). Lands in $OUT/g.tar.xz.
set -u
. scripts/gpu-env.sh
O=/tmp/s6g; mkdir -p $O
finish() { tar -cJf $OUT/g.tar.xz -C /tmp s6g; }
trap finish EXIT
timeout 150 $LB/tests/gpu/gpu_kernel_tests > $O/kernel_tests.log 2>&1; echo "rc $?" | tee $O/run.log
grep -E "^FAIL|passed|failed" $O/kernel_tests.log | tail -12 | tee -a $O/run.log
