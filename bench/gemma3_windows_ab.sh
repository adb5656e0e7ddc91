#!/usr/bin/env bash
# bench/gemma3_windows_ab.sh — the sliding-window A/B of docs/performance.md:
# Gemma 3 270M on the cpu backend with the window-aware paged cache (a,
# configs/ab/gemma3-windows.yaml: local layers' blocks freed once they leave
# the 512-token window) against one that keeps every layer's history (b,
# gemma3-no-windows.yaml), at long contexts. Each context L gets a KV budget
# of 1.25 sequences of L tokens without windows (36 KiB a token in f32), so
# (b) fits one sequence at a time and the fit count is what differs; every
# request is L - 16 prompt ids and 16 output tokens. Writes
# bench/results/cpu-ab-gemma3-windows.json (bench/record.py; $LOOM_RESULTS
# moves it).
#   Usage: bench/gemma3_windows_ab.sh [BUILD_DIR]
#   GEMMA3_AB_CASES="CONTEXT:REQUESTS ..." (default "8192:2"; the 2-core
#   machine prefills Gemma 3 270M at 55-110 tokens/s, so longer contexts and
#   more requests take hours: 16384:1 and 32768:1 measure one sequence's KV)
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
B=${1:-$root/build}
L="$B/cli/loom"
CASES=${GEMMA3_AB_CASES:-"8192:2"}
R=$(mktemp -d)
trap 'rm -rf "$R"' EXIT
cd "$root"
# one entry per context, each recorded as soon as it is measured (--merge)
for c in $CASES; do
  ctx=${c%%:*} n=${c##*:}
  gib=$(python3 -c "print(round($ctx * 36864 * 1.25 / 2**30, 4))")
  echo "== context $ctx: $n requests, KV budget $gib GiB" >&2
  "$L" bench --compare configs/ab/gemma3-windows.yaml configs/ab/gemma3-no-windows.yaml \
    --num-requests "$n" --input-len $((ctx - 16)) --output-len 16 --seed 5 --no-progress \
    --set engine.max_model_len="$ctx" --set cache.memory_gib="$gib" --json "$R/ctx$ctx.json"
  python3 bench/record.py cpu-ab-gemma3-windows --cpu --merge \
    --what "Gemma 3 270M on the cpu backend at long contexts, KV budget 1.25 sequences without windows: window-aware paged cache (a) vs every layer's history kept (b)" \
    --command "GEMMA3_AB_CASES=$c bench/gemma3_windows_ab.sh" \
    --bench "ctx$ctx=$R/ctx$ctx.json" --value "ctx${ctx}_kv_budget_gib=$gib"
done
