#!/usr/bin/env bash
# scripts/gpu/pack-old-backend.sh REV [NAME] — build the CUDA backend plugin of
# commit REV (a git worktree under /tmp, the same release options as build-gpu)
# and put it, xz-compressed, into .devpack/ beside this tree's build as
# old-NAME-cuda.so.xz (NAME defaults to "backend"), for
# `scripts/gpu/gpu-check.sh backend-ab`: the engine with this tree's backend against
# each packed one, alternated in one machine — the A/B a kernel change needs (two
# device calls differ by a few percent on their own; docs/performance.md).
# Two names (say base and mid) time a change in two steps in one call; each
# plugin is ~12 MB of the 64 MiB a device call carries, and backend-ab runs
# every old-*-cuda.so.xz in .devpack/: remove the ones done with.
# Takes several minutes (every CUDA kernel of REV is compiled).
#   scripts/gpu/pack-gpu.sh build-gpu --slim && scripts/gpu/pack-old-backend.sh 54a8624
set -euo pipefail
case "${1:-}" in -h|--help|"")
  sed -n '2,13p' "$0" | sed 's/^# \{0,1\}//'; [ -n "${1:-}" ]; exit $? ;;
esac
root=$(cd "$(dirname "$0")/../.." && pwd)
rev=$(git -C "$root" rev-parse --verify -q "$1^{commit}") || { echo "pack-old-backend: '$1' is not a commit here" >&2; exit 2; }
name=${2:-backend}
case $name in *[!a-z0-9]*|""|new) echo "pack-old-backend: NAME '$name' is not [a-z0-9]+ or is 'new' (this tree's side)" >&2; exit 2 ;; esac
wt=/tmp/loom-old-${rev:0:12}
if [ ! -d "$wt" ]; then
  git -C "$root" worktree add --detach "$wt" "$rev" >/dev/null
fi
if [ ! -f "$wt/build-gpu/build.ninja" ]; then
  echo "pack-old-backend: configuring $wt/build-gpu" >&2
  meson setup "$wt/build-gpu" "$wt" -Dbuildtype=release >/dev/null
fi
echo "pack-old-backend: building ${rev:0:12}'s loom-backend-cuda.so (minutes)" >&2
ninja -C "$wt/build-gpu" plugins/backend/cuda/loom-backend-cuda.so >&2
mkdir -p "$root/.devpack"
xz -T0 -c "$wt/build-gpu/plugins/backend/cuda/loom-backend-cuda.so" > "$root/.devpack/old-$name-cuda.so.xz"
echo "$rev" > "$root/.devpack/old-$name.rev"
du -sh "$root/.devpack/old-$name-cuda.so.xz" >&2
echo "pack-old-backend: done; remove the worktree with: git worktree remove --force $wt" >&2
