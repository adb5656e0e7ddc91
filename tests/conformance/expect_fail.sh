#!/bin/sh
# tests/conformance/expect_fail.sh LOOM PLUGIN [--OPTION...] NEEDLE... — run
# `loom plugin-test PLUGIN --quick [--OPTION...]` on a deliberately broken
# plugin: it must exit 1, and each NEEDLE must appear on a FAIL line (the
# message names the rule the plugin broke). Prints the run either way.
loom=$1
plugin=$2
shift 2
opts=""
while [ $# -gt 0 ] && [ "${1#--}" != "$1" ]; do
  opts="$opts $1"
  shift
done
# shellcheck disable=SC2086 # options are single words
out=$("$loom" plugin-test "$plugin" --quick $opts 2>&1)
rc=$?
printf '%s\n' "$out"
if [ "$rc" -ne 1 ]; then
  echo "expect_fail: loom plugin-test exited $rc, want 1 (a failed check)" >&2
  exit 1
fi
for needle in "$@"; do
  if ! printf '%s\n' "$out" | grep '^FAIL' | grep -qF -- "$needle"; then
    echo "expect_fail: no FAIL line says '$needle'" >&2
    exit 1
  fi
done
echo "expect_fail: refused as expected"
