#!/usr/bin/env bash
# scripts/gpu/gpu-smoke.sh — first look at a GPU machine: the device, the tools
# there, and the cuda backend through the whole engine on a tiny model.
set -u
. scripts/gpu/gpu-env.sh
O=${OUT:-/tmp/out}; mkdir -p "$O"
nvidia-smi --query-gpu=name,driver_version,memory.total,memory.used --format=csv
python3 -c "import torch, transformers; print('torch', torch.__version__, 'transformers', transformers.__version__)"
which pkg-config meson ninja compute-sanitizer ncu 2>&1 | head
loom --version
loom plugins 2>&1 | tail -14
loom run configs/gpu/tiny-dummy.yaml --help >/dev/null && echo run-help-ok
loom bench configs/gpu/tiny-dummy.yaml --num-requests 16 --input-len 20:60 --output-len 8:24 --no-progress 2>&1 | tail -18
