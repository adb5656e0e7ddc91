#!/usr/bin/env bash
# scripts/calibrate-smollm2.sh — make the SmoothQuant statistics that
# configs/quant/int8-w8a8-smoothquant*.yaml and fp8-smoothquant.yaml read:
#   ${LOOM_CACHE:-~/.cache/loom}/calib/SmolLM2-135M-Instruct.Q4_1.readme.act
# by running `loom calibrate` with configs/default.yaml (the float model) over
# this repository's README.md as of commit ee58f5f (~1,200 tokens; pinned so
# the statistics, and docs/quantization.md's numbers, do not move when the
# README does) — a text other than data/text/us-founding-documents.txt, which
# the perplexity table scores.
# Prints the path of the file on stdout; takes a few seconds.
set -euo pipefail

usage() {
    cat <<USAGE
usage: scripts/calibrate-smollm2.sh [--help] [--loom PATH] [--text FILE]

  --loom PATH   the loom binary (default: build/cli/loom)
  --text FILE   calibration text (default: README.md at commit ee58f5f)
USAGE
}
root=$(cd "$(dirname "$0")/.." && pwd)
loom="$root/build/cli/loom"
text=""
while [ $# -gt 0 ]; do
    case "$1" in
        -h|--help) usage; exit 0 ;;
        --loom) loom="$2"; shift 2 ;;
        --text) text="$2"; shift 2 ;;
        *) echo "calibrate-smollm2.sh: unknown option '$1' (try --help)" >&2; exit 2 ;;
    esac
done
[ -x "$loom" ] || { echo "calibrate-smollm2.sh: no loom binary at $loom (build first, or --loom)" >&2; exit 1; }
cache="${LOOM_CACHE:-$HOME/.cache/loom}"
out="$cache/calib/SmolLM2-135M-Instruct.Q4_1.readme.act"
mkdir -p "$cache/calib"
cd "$root"
tmp=""
if [ -z "$text" ]; then
    tmp=$(mktemp)
    trap 'rm -f "$tmp"' EXIT
    git -C "$root" show ee58f5f:README.md > "$tmp" 2>/dev/null || {
        echo "calibrate-smollm2.sh: cannot read README.md at ee58f5f (not a git checkout?); using" \
             "the current README.md, so the numbers may differ slightly" >&2
        cp "$root/README.md" "$tmp"; }
    text="$tmp"
fi
"$loom" calibrate configs/default.yaml "$text" --max-tokens 2048 -q --out "$out" >&2
echo "$out"
