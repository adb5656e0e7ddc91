#!/bin/bash
# Session 9, device call D: gpu_bench --quant-m 1 with the new "mixed"
# chain (a decode layer's small kernels between the linears) beside the
# plain chain: does the bench that predicts the engine rank the one-row
# kernels as the engine did (bulk kernel no faster)? Lands in $OUT/d.tar.xz.
set -u
. scripts/gpu-env.sh
O=/tmp/s9d; mkdir -p $O
finish() { tar -cJf $OUT/d.tar.xz -C /tmp s9d; }
trap finish EXIT
timeout 120 $LB/bench/gpu/gpu_bench $O/quant_m1.json --quant-m 1 > $O/quant_m1.txt 2>&1; echo "gpu_bench rc $?" | tee $O/run.log
grep -E "^    (chained|mixed)" $O/quant_m1.txt | tee -a $O/run.log
