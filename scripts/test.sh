#!/usr/bin/env bash
# scripts/test.sh — set up, build and run loom's whole CPU test suite, then
# the same under AddressSanitizer + UndefinedBehaviorSanitizer, then the
# in-tree fuzzers (tests/fuzz: corpus replay and a short fuzz of each
# target, ASan + UBSan), and print one summary line "N passed, N failed"
# counting individual test cases.
# GPU tests (tests/gpu) run only on a GPU machine: scripts/gpu/gpu-check.sh.
set -uo pipefail
usage() {
  cat <<'USAGE'
Usage: scripts/test.sh [--no-sanitize] [--no-fuzz] [--suite NAME]...

Installs build dependencies (scripts/setup.sh), fetches the default model
and Gemma 3 270M (scripts/fetch-model.sh [gemma3-270m]; tests that need
them skip with a message if that fails) and the openai client with
jsonschema (scripts/python-env.sh, a venv in the cache; the client test
skips without them, and with the default model present that counts as one
failure, so a run cannot pass without the client test), builds in ./build and runs every test suite; then builds in
./build-asan with ASan+UBSan and runs them again; then builds the fuzz
harnesses in ./build-fuzz (clang; scripts/setup.sh --fuzz) and runs suite
'fuzz': each target replays tests/fuzz/corpus and fuzzes for
LOOM_FUZZ_SECONDS (default 20) — a finding fails the run. --no-sanitize
skips both sanitized steps; --suite runs the fuzz step only when one of the
suites is 'fuzz'. Ends with "N passed, N failed" (Criterion test cases;
other tests, each fuzz replay and fuzz run included, count one each).
USAGE
}
root=$(cd "$(dirname "$0")/.." && pwd)
sanitize=1
fuzz=1
suites=()
fuzz_suite=0
while [ $# -gt 0 ]; do
  case "$1" in
    -h|--help) usage; exit 0 ;;
    --no-sanitize) sanitize=0; fuzz=0; shift ;;
    --no-fuzz) fuzz=0; shift ;;
    --suite) suites+=(--suite "$2"); [ "$2" = fuzz ] && fuzz_suite=1; shift 2 ;;
    *) echo "test.sh: unknown option '$1' (try --help)" >&2; exit 2 ;;
  esac
done
cd "$root"

if model=$(scripts/fetch-model.sh); then
  export LOOM_TEST_MODEL="$model"
else
  echo "test.sh: WARNING: could not fetch the default model; tests that need it will skip" >&2
fi
if model=$(scripts/fetch-model.sh gemma3-270m); then
  export LOOM_TEST_GEMMA_MODEL="$model"
else
  echo "test.sh: WARNING: could not fetch Gemma 3 270M; the Gemma tests will skip" >&2
fi

builds=("$root/build")
scripts/setup.sh --build-dir "$root/build" >/dev/null || { echo "test.sh: build failed"; echo "0 passed, 1 failed"; exit 1; }
# after setup.sh (python3-venv): the openai client and jsonschema for tests/serve
# With the model present, the client test would run but for the Python
# environment: its skip counts as a failure rather than passing unseen.
setup_failed=0
if py=$(scripts/python-env.sh); then
  export LOOM_TEST_PYTHON="$py"
elif [ -n "${LOOM_TEST_MODEL:-}" ]; then
  echo "test.sh: FAILURE: scripts/python-env.sh could not install openai / jsonschema, so the openai client" \
       "test (tests/serve/openai_client_test.sh) cannot run; counted as one failure" >&2
  setup_failed=1
else
  echo "test.sh: WARNING: could not install openai / jsonschema; the client test will skip" >&2
fi
if [ $sanitize = 1 ]; then
  scripts/setup.sh --sanitize --build-dir "$root/build-asan" >/dev/null || {
    echo "test.sh: sanitizer build failed"; echo "0 passed, 1 failed"; exit 1; }
  builds+=("$root/build-asan")
fi

rc=0
for b in "${builds[@]}"; do
  echo "== meson test -C $b ==" >&2
  ASAN_OPTIONS=detect_leaks=1:abort_on_error=0 LSAN_OPTIONS=suppressions="$root/scripts/lsan.supp" \
    UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
    meson test -C "$b" --print-errorlogs --num-processes 2 -t 4 "${suites[@]}" >&2 || rc=1
done

# The fuzz step: its own build (clang, the core and the harnesses only).
[ ${#suites[@]} -gt 0 ] && [ $fuzz_suite = 0 ] && fuzz=0
if [ $fuzz = 1 ]; then
  rm -f "$root/build-fuzz/meson-logs/testlog.json" # a failed build then counts as one failure
  builds+=("$root/build-fuzz")
  if scripts/setup.sh --fuzz --build-dir "$root/build-fuzz" >/dev/null; then
    echo "== meson test -C $root/build-fuzz --suite fuzz ==" >&2
    LOOM_FUZZ_ARTIFACTS="$root/build-fuzz/fuzz-artifacts" UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
      meson test -C "$root/build-fuzz" --print-errorlogs --num-processes 2 --suite fuzz >&2 || rc=1
  else
    echo "test.sh: fuzz build failed (scripts/setup.sh --fuzz)" >&2
    rc=1
  fi
fi

python3 "$root/scripts/count_tests.py" --failed $setup_failed "${builds[@]}" || rc=1
exit $rc
