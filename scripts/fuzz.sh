#!/usr/bin/env bash
# scripts/fuzz.sh — long local fuzzing of loom's parsers (tests/fuzz):
# builds the harnesses (scripts/setup.sh --fuzz: clang, ASan + UBSan) and
# fuzzes each chosen target for SECONDS, JOBS targets at a time, keeping
# what it learns in a corpus outside the tree.
set -uo pipefail
usage() {
  cat <<'USAGE'
Usage: scripts/fuzz.sh [--seconds N] [--jobs N] [--work DIR] [--merge] [TARGET...]

Targets: every tests/fuzz/fuzz_TARGET.c (yaml gguf safetensors tokenizer_json encode chat
openai disagg constraint; default: all).
Each runs for --seconds (default 600) from tests/fuzz/corpus/TARGET plus
what earlier runs found in DIR/corpus/TARGET (--work, default
~/.cache/loom/fuzz). Findings go to DIR/findings/TARGET (crash-*, leak-*,
timeout-*, oom-*); the script exits 1 when any target found something.
--merge then minimises DIR's corpus of each target into
tests/fuzz/corpus/TARGET (only inputs that add coverage; review and commit
the small ones). Run under nice on a shared machine. What to do with a
finding: docs/security.md.
USAGE
}
root=$(cd "$(dirname "$0")/.." && pwd)
secs=600 jobs=1 work="$HOME/.cache/loom/fuzz" merge=0 targets=()
while [ $# -gt 0 ]; do
  case "$1" in
    -h|--help) usage; exit 0 ;;
    --seconds) secs=$2; shift 2 ;;
    --jobs) jobs=$2; shift 2 ;;
    --work) work=$2; shift 2 ;;
    --merge) merge=1; shift ;;
    -*) echo "fuzz.sh: unknown option '$1' (try --help)" >&2; exit 2 ;;
    *) targets+=("$1"); shift ;;
  esac
done
if [ ${#targets[@]} = 0 ]; then # every harness, so a new one is never left out
  for f in "$root"/tests/fuzz/fuzz_*.c; do t=${f##*/fuzz_}; targets+=("${t%.c}"); done
fi
build=$("$root/scripts/setup.sh" --fuzz --build-dir "$root/build-fuzz") || { echo "fuzz.sh: build failed" >&2; exit 1; }

one() { # TARGET: fuzz it; prints "TARGET: OK|FOUND (execs)"
  local t=$1 bin="$build/tests/fuzz/fuzz_$1"
  [ -x "$bin" ] || { echo "$t: no such target"; return 1; }
  mkdir -p "$work/corpus/$t" "$work/findings/$t"
  local log="$work/findings/$t/last-run.log"
  LOOM_FUZZ_ARTIFACTS="$work/findings" "$root/tests/fuzz/run_fuzz.sh" "$bin" fuzz-into "$root/tests/fuzz/corpus/$t" \
    "$root/tests/fuzz/dict/$t.dict" "$secs" "$work/corpus/$t" >"$log" 2>&1
  local rc=$? n
  n=$(grep -o 'number_of_executed_units: [0-9]*' "$log" | tail -1 | awk '{print $2}')
  if [ $rc = 0 ]; then echo "$t: OK (${n:-?} executions in $secs s)"; else echo "$t: FOUND something, see $log"; fi
  if [ $merge = 1 ]; then
    local m; m=$(mktemp -d)
    "$bin" -merge=1 "$m" "$root/tests/fuzz/corpus/$t" "$work/corpus/$t" >/dev/null 2>&1
    for f in "$m"/*; do [ -e "$f" ] && [ ! -e "$root/tests/fuzz/corpus/$t/$(basename "$f")" ] && cp "$f" "$root/tests/fuzz/corpus/$t/"; done
    rm -rf "$m"
  fi
  return $rc
}

rc=0 running=0
for t in "${targets[@]}"; do
  one "$t" & running=$((running + 1))
  if [ $running -ge "$jobs" ]; then wait -n || rc=1; running=$((running - 1)); fi
done
while [ $running -gt 0 ]; do wait -n || rc=1; running=$((running - 1)); done
exit $rc
