#!/usr/bin/env bash
# scripts/gpu/pack-gpu.sh BUILD_DIR — pack what the GPU machine needs into
# .devpack/ (git-ignored; named in the device tool's `carry`): the built
# binaries of BUILD_DIR (keeping the build-tree layout) and the host shared
# libraries the GPU image lacks (libyaml, PCRE2, cJSON, OpenBLAS + Fortran
# runtime; libmicrohttpd + GnuTLS as fallbacks), xz-compressed to fit the transfer limit. The GPU machine has no
# package registry, so nothing can be installed there.
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
B=$(cd "${1:?usage: pack-gpu.sh BUILD_DIR [--slim | --no-bench]}" && pwd)
# --slim: leave out gpu_kernel_tests and gpu_bench (each embeds every kernel,
# ~12 MB compressed), so a call can also carry a 49 MB model part within 64
# MiB; --no-bench: only gpu_bench, so a kernel change's call carries its
# kernel tests and an old backend (pack-old-backend.sh) together.
SLIM=${2:-}
case $SLIM in ""|--slim|--no-bench) ;; *) echo "pack-gpu: unknown option '$SLIM' (--slim or --no-bench)" >&2; exit 2 ;; esac
P="$root/.devpack"
mkdir -p "$P"
# git's exclude file (a worktree's .git is a file: ask git where it is)
git -C "$root" check-ignore -q .devpack/x 2>/dev/null ||
  echo '/.devpack/' >> "$(git -C "$root" rev-parse --git-path info/exclude)"
# Debian's meson (1.0) records no header dependencies for .cu objects: an
# edited kernels/cuda or formats header (.cuh, .h) leaves kernel objects stale, and a
# device run would time the old code. Refuse a build whose oldest .cu
# object is older than a header (the library itself is relinked whenever
# any object is rebuilt, so it proves nothing).
objs="$B/kernels/cuda/libloom_cuda_kernels.a.p"
if oldest=$(ls -tr "$objs"/*.cu.o 2>/dev/null | head -1) && [ -n "$oldest" ] &&
   stale=$(find "$root/kernels/cuda" "$root/formats" \( -name '*.cuh' -o -name '*.h' \) -newer "$oldest") &&
   [ -n "$stale" ]; then
  echo "pack-gpu: newer than $(basename "$oldest") ($B): $(echo "$stale" | sed "s|$root/||" | tr '\n' ' ')—" \
       "ninja does not see kernel headers with this meson: touch kernels/cuda/*.cu, rebuild, pack again" >&2
  exit 1
fi
cd "$B"
dirs=$(for d in core cli plugins tests/e2e tests/gpu bench/gpu tests/backend; do [ -d "$d" ] && echo "$d"; done)
files=$(find $dirs -maxdepth 4 \( -name '*.so' -o -name '*.so.*' -o \( -perm -u+x -type f \) \) \
        \( -type f -o -type l \) | grep -v '\.p/' | grep -v meson- || true)
[ "$SLIM" = --slim ] && files=$(echo "$files" | grep -v -e gpu_kernel_tests -e 'bench/gpu/gpu_bench')
[ "$SLIM" = --no-bench ] && files=$(echo "$files" | grep -v -e 'bench/gpu/gpu_bench')
tar -cJf "$P/build.tar.xz" $files loom_build_config.h
# what the binaries were built from, for bench/record.py on the GPU machine
# (the device's copy of the git metadata may be older than the tree)
rev=$(git -C "$root" rev-parse --short=12 HEAD 2>/dev/null || echo unknown)
git -C "$root" diff --quiet HEAD 2>/dev/null || rev="$rev-dirty"
echo "$rev" > "$P/commit.txt"
libs=()
for l in libcjson.so.1 libgfortran.so.5 libpcre2-8.so.0 libquadmath.so.0 libyaml-0.so.2; do
  libs+=("$(readlink -f /lib/x86_64-linux-gnu/$l)")
done
libs+=("$(readlink -f /usr/lib/x86_64-linux-gnu/openblas-pthread/libopenblas.so.0)")
# `loom serve` links libmicrohttpd, which links GnuTLS and its helpers (glibc
# aside). They travel apart (libs-fallback.tar.xz): gpu-env.sh links in
# only those the image lacks, so its own copies serve the rest (python on
# that machine shares the loader path).
fallback=("$(readlink -f /lib/x86_64-linux-gnu/libmicrohttpd.so.12)")
for l in $(ldd /lib/x86_64-linux-gnu/libmicrohttpd.so.12 | awk '/=> \//{print $3}' |
           grep -v -e '/libc\.so' -e '/libm\.so' -e '/ld-linux'); do
  fallback+=("$(readlink -f "$l")")
done
# Copy into a folder with the sonames the binaries ask for, then tar it.
pack_libs() { # TARBALL FILE...
  local out=$1 tmp
  shift
  tmp=$(mktemp -d)
  for f in "$@"; do cp "$f" "$tmp/"; done
  (cd "$tmp" && for f in *; do
     so=$(objdump -p "$f" | awk '/SONAME/{print $2}'); [ -n "$so" ] && [ "$so" != "$f" ] && mv "$f" "$so"; done)
  tar -cJf "$out" -C "$tmp" .
  rm -rf "$tmp"
}
pack_libs "$P/libs.tar.xz" "${libs[@]}"
pack_libs "$P/libs-fallback.tar.xz" "${fallback[@]}"
du -sh "$P"/* >&2
