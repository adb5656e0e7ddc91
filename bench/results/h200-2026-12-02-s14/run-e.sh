#!/bin/bash
# Session 14, device call E (scripts of b175232, binaries of a48987b): the
# awq stage as committed after the review (a failed or empty reference
# counts as a failure), tiny checkpoints on cuda and cpu. Lands in $OUT/e/.
set -u
mkdir -p $OUT/e
AWQ_SHAPES=tiny OUT=$OUT/e timeout 200 scripts/gpu-check.sh awq > $OUT/e/awq.txt 2>&1
echo "gpu-check awq (tiny) rc $?"; grep -E "PASS|FAIL|DIFF|failed" $OUT/e/awq.txt
