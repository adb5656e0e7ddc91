#!/bin/bash
# tests/gpu/host_emu/qtiled_emu.sh — run kernels/cuda/qtiled.cu's repack
# (codes and INT4 scale pairs) and its dequantize kernel on the CPU, without
# CUDA or a GPU: the device code is cut out of the .cu file as it is,
# compiled with g++ against host stand-ins for the few CUDA operations it
# uses (PRMT, LOP3, packed f16 / bf16 subtraction and fma rounded once,
# __syncwarp over 32 threads with a barrier), and checked against the
# row-major codes decoded on the host (qtiled_emu.cpp says how). A
# development check of the index arithmetic, not a replacement for
# tests/gpu/gpu_kernel_tests on the device. Exit status 0 = passed.
#   tests/gpu/host_emu/qtiled_emu.sh
set -eu
here=$(cd "$(dirname "$0")" && pwd)
src=$here/../../../kernels/cuda
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
# the lane-vector word and the INT4 fragment decode (qtiled.cuh), the layout
# mapping, the repack kernels and the dequantize kernel (qtiled.cu, up to the
# dispatch)
awk '/^__device__ __forceinline__ uint32_t lc_qt_word/{p=1} p{print} p&&/^}/{p=0}' "$src/qtiled.cuh" > "$tmp/qtiled_part.inc"
awk '/^\/\* INT4 word \(one k16 step\)/{p=1} /^\/\* int8 word \(bytes 0..3\)/{p=0} p' "$src/qtiled.cuh" >> "$tmp/qtiled_part.inc"
awk '/^\/\* -+ layout mapping \*\//{p=1} /^\/\* -+ dispatch \*\//{p=0} p' "$src/qtiled.cu" >> "$tmp/qtiled_part.inc"
g++ -std=c++17 -O1 -Wall -Wno-unknown-pragmas -pthread -I"$tmp" -I"$here/../../.." -o "$tmp/emu" "$here/qtiled_emu.cpp"
"$tmp/emu"
