#!/usr/bin/env bash
# tests/fuzz/run_fuzz.sh — one fuzz target, as a test:
#   run_fuzz.sh BIN replay CORPUS DICT          every corpus file once
#   run_fuzz.sh BIN fuzz CORPUS DICT [SECONDS]  mutate from the corpus
#   run_fuzz.sh BIN fuzz-into CORPUS DICT SECONDS DIR   the same, keeping
#                                               new inputs in DIR (scripts/fuzz.sh)
# SECONDS defaults to $LOOM_FUZZ_SECONDS, else 20. New inputs go to a
# scratch directory (the committed corpus is only read); a finding is kept
# under $LOOM_FUZZ_ARTIFACTS (default: fuzz-artifacts/ in the current
# directory) and fails the run. Exit status: libFuzzer's (0: no finding).
set -uo pipefail
bin=$1 mode=$2 corpus=$3 dict=$4
secs=${5:-${LOOM_FUZZ_SECONDS:-20}}
name=$(basename "$bin")
art=${LOOM_FUZZ_ARTIFACTS:-$PWD/fuzz-artifacts}/$name
mkdir -p "$art"
# per-input limits: a slow or memory-hungry input is a finding too
# (exit 1 on any finding: libFuzzer's default 77 would read as "skipped" to meson)
common=(-timeout=10 -rss_limit_mb=2048 -malloc_limit_mb=1024 -error_exitcode=1 -timeout_exitcode=1
        -artifact_prefix="$art/" -print_final_stats=1)
[ -d "$corpus" ] || { echo "run_fuzz: no corpus $corpus" >&2; exit 2; }
case "$mode" in
  replay)
    files=("$corpus"/*)
    [ -e "${files[0]}" ] || { echo "run_fuzz: $corpus is empty" >&2; exit 2; }
    echo "run_fuzz: $name: replaying ${#files[@]} corpus files"
    "$bin" "${common[@]}" "${files[@]}"
    rc=$?
    [ $rc = 0 ] || { echo "run_fuzz: $name fails on a corpus file (exit $rc): a regression" >&2; exit 1; }
    exit 0 ;;
  fuzz|fuzz-into)
    if [ "$mode" = fuzz-into ]; then
      work=$6
    else
      work=$(mktemp -d)
      trap 'rm -rf "$work"' EXIT
    fi
    d=(); [ -f "$dict" ] && d=(-dict="$dict")
    echo "run_fuzz: $name: fuzzing for $secs s from $corpus"
    "$bin" "${common[@]}" "${d[@]}" -max_total_time="$secs" "$work" "$corpus"
    rc=$?
    [ $rc = 0 ] || { echo "run_fuzz: $name found something (exit $rc): the input is in $art; see docs/security.md (findings)" >&2; exit 1; }
    exit 0 ;;
  *) echo "run_fuzz: mode must be replay, fuzz or fuzz-into" >&2; exit 2 ;;
esac
