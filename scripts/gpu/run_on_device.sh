#!/bin/bash
# scripts/gpu/run_on_device.sh — run the GPU tests and the GPU benchmark on a
# machine with a Hopper GPU, from a build tree made elsewhere or there.
#
#   scripts/gpu/run_on_device.sh BUILD_DIR [OUT_DIR] [--no-bench] [--sanitize] [--racecheck] [--quick]
#                              [--racecheck-linear] [--no-kernel-tests] [--no-backend-test]
#
# --sanitize: every program under compute-sanitizer memcheck; --racecheck:
# gpu_kernel_tests again under compute-sanitizer racecheck (shared-memory
# hazards of the attention, top-k and GEMV kernels); --racecheck-linear: the
# same over the linear-layer tests only (GEMV, quantized, GGUF; a few
# minutes less); --no-kernel-tests / --no-backend-test: skip the plain
# gpu_kernel_tests / gpu_backend_test run.
#
# BUILD_DIR holds tests/gpu/gpu_kernel_tests, tests/gpu/gpu_backend_test,
# bench/gpu/gpu_bench, plugins/backend/{cuda,cpu}/*.so and core/libloom.so.0
# (a meson build dir, or a copy of those files in the same layout), and
# optionally tests/gpu/gpu_tp_test with plugins/executor/{tp,pp}/*.so
# (pipeline stages on one GPU; tensor parallelism, which skips itself with
# fewer than 2 GPUs). Extra shared
# libraries the machine lacks (openblas, libyaml, libnccl, ...) may sit in
# BUILD_DIR/../lib. Logs and gpu_bench.json go to OUT_DIR (default $OUT, or
# ./gpu-out); the current figures to $LOOM_RESULTS (default bench/results):
# <hw>-gpu-tests.json (each program's pass count, one entry per program and
# mode) and <hw>-gpu-kernels.json (gpu_bench), by bench/record.py.
# Exit status: number of failed programs.
set -u
root=$(cd "$(dirname "$0")/../.." && pwd)
B=$(cd "${1:?usage: run_on_device.sh BUILD_DIR [OUT_DIR] [--no-bench] [--sanitize] [--racecheck] [--quick]}" && pwd)
shift
O=${OUT:-./gpu-out}
if [ $# -gt 0 ] && [ "${1#--}" = "$1" ]; then O=$1; shift; fi
flags="$*"
BENCH=1 SAN="" QUICK="" RACE=0 KT=1 BT=1
for a in "$@"; do
  case $a in
    --no-bench) BENCH=0 ;;
    --sanitize) SAN="compute-sanitizer --tool memcheck --error-exitcode 99" ;;
    --quick) QUICK=--quick ;;
    --racecheck) RACE=1 ;;
    --racecheck-linear) RACE=2 ;;
    --no-kernel-tests) KT=0 ;;
    --no-backend-test) BT=0 ;;
  esac
done
mkdir -p "$O"
for d in "$B/../lib" /usr/local/cuda/lib64 /usr/local/cuda/targets/x86_64-linux/lib; do
  [ -d "$d" ] && export LD_LIBRARY_PATH="$d${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
done
if ! ldconfig -p | grep -q libcublasLt.so.13 && [ ! -e /usr/local/cuda/lib64/libcublasLt.so.13 ]; then
  lt=$(find / -name 'libcublasLt.so.13' -not -path '*/proc/*' 2>/dev/null | head -1)
  [ -n "$lt" ] && export LD_LIBRARY_PATH="$(dirname "$lt"):$LD_LIBRARY_PATH"
fi
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.max.sm --format=csv | tee "$O/device.txt"
fails=0
if [ $KT = 1 ]; then
  echo "=== gpu_kernel_tests"
  t0=$SECONDS
  $SAN "$B/tests/gpu/gpu_kernel_tests" 2>&1 | tee "$O/kernel_tests.log"
  [ "${PIPESTATUS[0]}" = 0 ] || fails=$((fails + 1))
  echo "took $((SECONDS - t0)) s" > "$O/kernel_tests.took"
fi
if [ $RACE != 0 ]; then
  echo "=== gpu_kernel_tests under racecheck"
  # cuBLASLt's Hopper kernels (nvjet_*) synchronise through mbarriers and
  # TMA, which racecheck does not model: thousands of "potential WAR
  # hazards" inside them on every GEMM on the H200. Excluding them
  # with --kernel-name-exclude made the sanitizer fail on a hardware
  # exception, so every kernel is checked and the report is counted per
  # kernel; only hazards in loom's own kernels (lc_*, tk_*) fail the run.
  [ $RACE = 2 ] && export LOOM_GPU_KERNEL_TESTS=linear
  compute-sanitizer --tool racecheck --racecheck-report hazard --print-limit 100000 \
    "$B/tests/gpu/gpu_kernel_tests" > "$O/kernel_tests_racecheck.log" 2>&1
  echo "hazards per kernel (access, kernel):"
  grep -oE '(Read|Write) Thread \([0-9,]+\) at [^+ ]+' "$O/kernel_tests_racecheck.log" \
    | awk '{print $1, $NF}' | sort | uniq -c | sort -rn | head -20
  grep -E '(Read|Write) Thread .* at (lc_|tk_|void lc_|void tk_)' "$O/kernel_tests_racecheck.log" | head -3 \
    | grep -q . && fails=$((fails + 1))
  tail -2 "$O/kernel_tests_racecheck.log"
  unset LOOM_GPU_KERNEL_TESTS
fi
if [ $BT = 1 ]; then
  echo "=== gpu_backend_test"
  export LOOM_QUANTIZER_DIR=${LOOM_QUANTIZER_DIR:-$B/plugins/quantizer}   # int8/fp8/int4 checks
  # transformers' tiny Mixtral / Qwen2-MoE checkpoints, from the repository root
  [ -d tests/backend/data/moe ] && export LOOM_TEST_HF_MOE_DIR=${LOOM_TEST_HF_MOE_DIR:-$PWD/tests/backend/data/moe}
  t0=$SECONDS
  $SAN "$B/tests/gpu/gpu_backend_test" "$B/plugins/backend/cuda/loom-backend-cuda.so" \
    "$B/plugins/backend/cpu/loom-backend-cpu.so" 2>&1 | tee "$O/backend_test.log"
  [ "${PIPESTATUS[0]}" = 0 ] || fails=$((fails + 1))
  echo "took $((SECONDS - t0)) s" > "$O/backend_test.took"
fi
if [ -x "$B/tests/gpu/gpu_tp_test" ]; then
  echo "=== gpu_tp_test"
  export NCCL_NVLS_ENABLE=${NCCL_NVLS_ENABLE:-0}   # docs/tensor-parallel.md
  t0=$SECONDS
  $SAN "$B/tests/gpu/gpu_tp_test" "$B/plugins/backend/cuda/loom-backend-cuda.so" \
    "$B/plugins/executor/tp/loom-executor-tp.so" "$B/plugins/executor/pp/loom-executor-pp.so" 2>&1 |
    tee "$O/tp_test.log"
  [ "${PIPESTATUS[0]}" = 0 ] || fails=$((fails + 1))
  echo "took $((SECONDS - t0)) s" > "$O/tp_test.took"
fi
if [ $BENCH = 1 ]; then
  echo "=== gpu_bench"
  "$B/bench/gpu/gpu_bench" "$O/gpu_bench.json" "$B/plugins/backend/cuda/loom-backend-cuda.so" $QUICK \
    2>&1 | tee "$O/bench.log"
  [ "${PIPESTATUS[0]}" = 0 ] || fails=$((fails + 1))
fi
echo "=== summary"
grep -h '^FAIL\|^SKIP' "$O"/kernel_tests.log "$O"/backend_test.log "$O"/tp_test.log 2>/dev/null | head -50
grep -h 'passed,' "$O"/kernel_tests.log "$O"/backend_test.log "$O"/tp_test.log 2>/dev/null
echo "programs failed: $fails"
# the current figures (bench/results/README.md)
rec=(python3 "$root/bench/record.py" --command "scripts/gpu/run_on_device.sh BUILD_DIR OUT_DIR${flags:+ $flags}")
mode=plain; [ -n "$SAN" ] && mode=memcheck
tests=()
for t in kernel_tests backend_test tp_test; do
  run=1
  [ $t = kernel_tests ] && [ $KT = 0 ] && run=0
  [ $t = backend_test ] && [ $BT = 0 ] && run=0
  rm -f "$O/$t.summary" # a reused OUT: only this run's programs are recorded
  [ $run = 1 ] && [ -s "$O/$t.log" ] && grep -h 'passed,' "$O/$t.log" > "$O/$t.summary" &&
    cat "$O/$t.took" >> "$O/$t.summary" 2>/dev/null; # the program's wall time
  [ $run = 1 ] && [ -s "$O/$t.summary" ] && tests+=(--text "gpu_$t $mode=$O/$t.summary")
done
if [ $RACE != 0 ] && [ -s "$O/kernel_tests_racecheck.log" ]; then
  { grep -h 'passed,' "$O/kernel_tests_racecheck.log"
    echo "hazards in loom's kernels (lc_*, tk_*): $(grep -cE '(Read|Write) Thread .* at (lc_|tk_|void lc_|void tk_)' "$O/kernel_tests_racecheck.log")"
  } > "$O/racecheck.summary"
  tests+=(--text "gpu_kernel_tests racecheck$([ $RACE = 2 ] && echo -linear)=$O/racecheck.summary")
fi
[ ${#tests[@]} -gt 0 ] && "${rec[@]}" '{hw}-gpu-tests' --merge \
  --what "tests/gpu programs: every kernel vs float64, cuda vs cpu backend, tp executor; pass counts" "${tests[@]}"
[ $BENCH = 1 ] && [ -s "$O/gpu_bench.json" ] && "${rec[@]}" '{hw}-gpu-kernels' \
  --what "gpu_bench: copy and GEMM ceilings, each kernel of a Llama-3-8B layer, decode attention at 32k, SmolLM2 and Llama-3-8B steps" \
  --json gpu_bench="$O/gpu_bench.json"
exit $fails
