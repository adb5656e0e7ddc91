#!/usr/bin/env bash
# bench/cpu_greedy_agreement.sh — how far the default CPU path's greedy text
# (GGUF blocks as stored, 8-bit block activations) follows the float32 path
# (backend.weight_dtype=f32) on the same file: each chat prompt of
# bench/data/chat-prompts.txt, N greedy tokens on both, the position of the
# first difference. Writes bench/results/cpu-smollm2-greedy-agreement.json
# (bench/record.py; $LOOM_RESULTS moves it).
#   Usage: bench/cpu_greedy_agreement.sh [BUILD_DIR] [N (default 48)]
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
B=${1:-$root/build}
N=${2:-48}
T="$B/tests/e2e/engine_tool"
[ -x "$T" ] || { echo "cpu_greedy_agreement: $T not built" >&2; exit 1; }
cd "$root"
R=$(mktemp -d)
trap 'rm -rf "$R"' EXIT
i=0
while IFS= read -r p; do
  [ -n "$p" ] || continue
  "$T" greedy configs/default.yaml "$N" "$p" > "$R/q8.$i" 2> "$R/err"  || { cat "$R/err" >&2; exit 1; }
  "$T" greedy configs/default.yaml "$N" "$p" --set backend.weight_dtype=f32 > "$R/f32.$i" 2> "$R/err" ||
    { cat "$R/err" >&2; exit 1; }
  i=$((i + 1))
done < bench/data/chat-prompts.txt
python3 - "$R" "$i" "$N" > "$R/summary.txt" <<'PY'
import sys
r, n, N = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
same, frac = 0, []
for i in range(n):
    a = open(f"{r}/q8.{i}").read().split()
    b = open(f"{r}/f32.{i}").read().split()
    k = next((j for j, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
    same += a == b
    frac.append(k / max(len(b), 1))
    print(f"prompt {i + 1}: first difference at token {k} of {len(b)}" if a != b else f"prompt {i + 1}: identical ({len(b)} tokens)")
print(f"identical {same} of {n}; mean share of the f32 path's tokens matched before the first difference {sum(frac) / n:.2f}")
PY
cat "$R/summary.txt"
last=$(tail -1 "$R/summary.txt")
python3 bench/record.py cpu-smollm2-greedy-agreement --cpu \
  --what "greedy text of configs/default.yaml (GGUF blocks, 8-bit activations) vs the f32 path on the same file: $i chat prompts x $N tokens" \
  --command "bench/cpu_greedy_agreement.sh" --text per_prompt="$R/summary.txt" \
  --value identical="$(echo "$last" | awk '{print $2}')" --value prompts="$i" \
  --value mean_matched_share="$(echo "$last" | awk '{print $NF}')"
