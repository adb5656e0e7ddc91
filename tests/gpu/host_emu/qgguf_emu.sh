#!/bin/bash
# tests/gpu/host_emu/qgguf_emu.sh — run kernels/cuda/qgguf.cu's decoding
# and GEMV kernel on the CPU, without CUDA or a GPU: the device code is cut
# out of the .cu file as it is, compiled with g++ against host stand-ins
# for the few CUDA intrinsics it uses (funnel shift, PRMT, f16, __ldcs,
# __syncwarp and shuffles over 32 threads with a barrier), and checked
# against formats/gguf_blocks.h's decode (qgguf_emu.cpp says how).
# A development check of the index arithmetic, not a replacement for
# tests/gpu/gpu_kernel_tests on the device. Exit status 0 = passed.
#   tests/gpu/host_emu/qgguf_emu.sh
set -eu
here=$(cd "$(dirname "$0")" && pwd)
src=$here/../../../kernels/cuda
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
# the kernel's geometry, decoders, staging and GEMV kernel (up to its launcher)
awk '/^\/\* -+ geometry \*\//{p=1} /^template <typename T, int TYPE, int M>$/{p=0} p' \
  "$src/qgguf.cu" > "$tmp/qgguf_part.inc"
# common.cuh's integer-code conversions
awk '/integer codes to float/{p=1} /programmatic dependent launch/{p=0} p' \
  "$src/common.cuh" > "$tmp/codes.inc"
g++ -std=c++17 -O1 -Wall -Wno-unknown-pragmas -pthread -I"$tmp" -I"$here/../../.." -o "$tmp/emu" "$here/qgguf_emu.cpp"
"$tmp/emu"
