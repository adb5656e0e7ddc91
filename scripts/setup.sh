#!/usr/bin/env bash
# scripts/setup.sh — install what loom needs to build on Debian 12 and
# configure + build it. Idempotent: skips packages already installed.
#
#   scripts/setup.sh [--help] [--build-dir DIR] [--sanitize | --fuzz] [-- extra meson args]
set -euo pipefail
usage() {
  cat <<'USAGE'
Usage: scripts/setup.sh [--build-dir DIR] [--sanitize | --fuzz] [-- MESON_ARGS...]

Installs the Debian packages loom builds with (meson, ninja, libyaml, PCRE2,
cJSON, OpenBLAS, Criterion, pkg-config, python3-pip, python3-venv, unzip), then configures
and builds loom in DIR (default: build). --sanitize builds with
AddressSanitizer + UndefinedBehaviorSanitizer (default DIR: build-asan).
--fuzz installs clang too and builds only the core and the libFuzzer
harnesses of tests/fuzz with clang, ASan + UBSan (default DIR: build-fuzz).
CUDA parts build when nvcc is on PATH (or /usr/local/cuda/bin exists).
USAGE
}
root=$(cd "$(dirname "$0")/.." && pwd)
build=""
sanitize=0
fuzz=0
extra=()
while [ $# -gt 0 ]; do
  case "$1" in
    -h|--help) usage; exit 0 ;;
    --build-dir) build="$2"; shift 2 ;;
    --sanitize) sanitize=1; shift ;;
    --fuzz) fuzz=1; shift ;;
    --) shift; extra=("$@"); break ;;
    *) echo "setup.sh: unknown option '$1' (try --help)" >&2; exit 2 ;;
  esac
done
if [ -z "$build" ]; then
  if [ $fuzz = 1 ]; then build="$root/build-fuzz"
  elif [ $sanitize = 1 ]; then build="$root/build-asan"
  else build="$root/build"; fi
fi

pkgs=(meson ninja-build pkg-config gcc g++ libyaml-dev libpcre2-dev libcjson-dev libmicrohttpd-dev libopenblas-dev
      libcriterion-dev python3 python3-pip python3-venv unzip ca-certificates)
[ $fuzz = 1 ] && pkgs+=(clang) # libFuzzer and its sanitizer runtimes come with Debian's clang
missing=()
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "setup: installing ${missing[*]}" >&2
  SUDO=""
  if [ "$(id -u)" != 0 ]; then
    command -v sudo >/dev/null || { echo "setup: need root (or sudo) to apt-get install ${missing[*]}" >&2; exit 1; }
    SUDO=sudo
  fi
  $SUDO apt-get update -qq >&2
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${missing[@]}" >&2
fi

[ -d /usr/local/cuda/bin ] && export PATH="$PATH:/usr/local/cuda/bin"

args=(-Dbuildtype=debugoptimized)
[ $sanitize = 1 ] && args+=(-Db_sanitize=address,undefined -Db_lundef=false)
if [ $fuzz = 1 ]; then
  # the harnesses need no GPU code; the compiler is fixed when the dir is set up
  args+=(-Dfuzz=true -Dcuda=disabled -Dtests=disabled -Db_sanitize=address,undefined -Db_lundef=false)
  export CC=clang
fi
if [ -f "$build/build.ninja" ]; then
  meson configure "$build" "${args[@]}" "${extra[@]}" >/dev/null
else
  # nvcc through scripts/nvcc-depfile: meson < 1.3 (Debian 12 has 1.0) gives nvcc no
  # dependency file, so an edited .cuh would not rebuild the kernels that include it
  if [ $fuzz = 0 ] && command -v nvcc >/dev/null; then
    mkdir -p "$build"
    printf "[binaries]\ncuda = '%s'\n" "$root/scripts/nvcc-depfile" > "$build/nvcc-native.ini"
    args+=(--native-file "$build/nvcc-native.ini")
  fi
  meson setup "$build" "$root" "${args[@]}" "${extra[@]}" >&2
fi
ninja -C "$build" >&2
echo "$build"
