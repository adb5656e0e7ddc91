#!/bin/bash
# tests/gpu/host_emu/qtiled_gemv_emu.sh — run kernels/cuda/qtiled.cu's
# stream kernel (1..8 rows on the tiled layout, its pair epilogue's row
# mapping) and the load-time repack it reads, on the CPU, without CUDA or a
# GPU: the device code is cut out of the .cu file as it is and compiled with
# g++ against host stand-ins for the few CUDA intrinsics it uses (PRMT,
# LOP3, packed bf16 / f16 arithmetic, mma.sync m16n8k16 as a warp of 32
# threads meeting at a barrier, the CTA barrier over 256) and checked against
# float64 sums of the untiled weights (qtiled_gemv_emu.cpp says how). A
# development check of the index arithmetic, not a replacement for
# tests/gpu/gpu_kernel_tests on the device. Exit status 0 = passed.
#   tests/gpu/host_emu/qtiled_gemv_emu.sh
set -eu
here=$(cd "$(dirname "$0")" && pwd)
src=$here/../../../kernels/cuda/qtiled.cu
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
# one function or struct from its first line (a regex) to the first "}" or
# "};" line that closes it
cut_fn() { awk -v re="$1" '$0 ~ re {p=1} p {print} p && /^}/ {exit}' "$src"; }
{
  awk '/^#define LC_QT_WARPS/{p=1} p{print} p && /^};$/{exit}' "$src"   # geometry, lc_qt
  cut_fn '^__device__ __forceinline__ uint32_t lc_qt_word'
  echo 'template <typename T>'
  cut_fn '^__device__ __forceinline__ void lc_qt_dec4'
  cut_fn '^template <typename T> __device__ __forceinline__ void lc_qt_dec8'
  # the layout mapping and the repack (up to the dequantize kernel)
  awk '/^\/\* -+ layout mapping \*\//{p=1} /lc_qtiled_dequant_kernel\(/{exit} p' "$src" | sed '$d' | sed '$d'
  # the stream kernel
  awk '/^\/\* -+ up to 8 rows: a stream/{p=1} /^\/\* -+ wgmma \(Hopper\) path \*\//{exit} p' "$src"
} > "$tmp/qtiled_part.inc"
g++ -std=c++17 -O1 -Wall -Wno-unknown-pragmas -Wno-unused-variable -pthread -I"$tmp" -I"$here/../../.." \
  -o "$tmp/emu" "$here/qtiled_gemv_emu.cpp"
"$tmp/emu"
