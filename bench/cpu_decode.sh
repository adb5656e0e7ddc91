#!/usr/bin/env bash
# bench/cpu_decode.sh [BUILD_DIR] — the cpu backend's batch-1 decode against
# the memory-bandwidth roofline measured in the same run (bench/cpu_decode.c,
# built as BUILD_DIR/tests/backend/cpu_decode), on the default SmolLM2 model;
# writes the current figure bench/results/cpu-smollm2-decode-roofline.json
# (bench/record.py; $LOOM_RESULTS moves it). Run it on a quiet machine.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
B=${1:-$root/build}
model=${LOOM_TEST_MODEL:-$("$root/scripts/fetch-model.sh")}
out=$(mktemp)
trap 'rm -f "$out"' EXIT
"$B/tests/backend/cpu_decode" "$model" | tee "$out"
python3 "$root/bench/record.py" cpu-smollm2-decode-roofline --cpu \
  --what "SmolLM2-135M (Q4_1 dequantized to f32) on the cpu backend: batch-1 decode vs weights-per-token / copy bandwidth, batch 8, 128-token prefill" \
  --command "bench/cpu_decode.sh" --text table="$out"
