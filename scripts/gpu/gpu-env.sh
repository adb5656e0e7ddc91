# scripts/gpu/gpu-env.sh — source on the GPU machine: unpack .devpack (made by
# scripts/gpu/pack-gpu.sh) into /tmp/loom and point the loader at it.
#   . scripts/gpu/gpu-env.sh     → $LB is the unpacked build tree
export LB=/tmp/loom/build
if [ ! -x "$LB/cli/loom" ] || [ .devpack/build.tar.xz -nt "$LB/cli/loom" ]; then
  rm -rf /tmp/loom && mkdir -p /tmp/loom/build /tmp/loom/lib
  tar -xJf .devpack/build.tar.xz -C "$LB" && tar -xJf .devpack/libs.tar.xz -C /tmp/loom/lib
  mkdir -p /tmp/loom/lib-fallback
  [ -f .devpack/libs-fallback.tar.xz ] && tar -xJf .devpack/libs-fallback.tar.xz -C /tmp/loom/lib-fallback
fi
export LD_LIBRARY_PATH=/tmp/loom/lib:/usr/local/cuda/lib64${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
# lib-fallback (libmicrohttpd, GnuTLS & co.): only the ones the image lacks
# are linked into lib/, so its own copies keep serving everything else
# (python shares this loader path)
for _ in 1 2 3 4; do
  need=$(ldd "$LB/cli/loom" 2>/dev/null | awk '/not found/{print $1}')
  [ -n "$need" ] || break
  for so in $need; do [ -e "/tmp/loom/lib-fallback/$so" ] && ln -sf "/tmp/loom/lib-fallback/$so" /tmp/loom/lib/ || true; done
done
export LOOM_PLUGIN_PATH="$LB/plugins" LOOM_PLUGIN_PATH_ONLY=1 NCCL_NVLS_ENABLE=0
# gpu_backend_test's quantizer plugins (its default is the build machine's path)
export LOOM_QUANTIZER_DIR="${LOOM_QUANTIZER_DIR:-$LB/plugins/quantizer}"
export PATH="$LB/cli:$PATH"
# the pack carries its libraries (pack-gpu.sh); say at once if one is missing
if missing=$(ldd "$LB/cli/loom" 2>/dev/null | awk '/not found/{print $1}') && [ -n "$missing" ]; then
  echo "gpu-env: loom cannot load: missing $(echo $missing) — add them to scripts/gpu/pack-gpu.sh's list" >&2
fi
# NCCL for the tp executor: the image ships it inside PyTorch's wheels
# (nvidia-nccl-cu13), not on the loader's path.
if ! ldconfig -p 2>/dev/null | grep -q libnccl.so.2; then
  nccl=$(python3 -c 'import nvidia.nccl, os; print(os.path.dirname(nvidia.nccl.__file__) + "/lib")' 2>/dev/null)
  [ -e "$nccl/libnccl.so.2" ] || nccl=$(dirname "$(find / -name libnccl.so.2 -not -path '/proc/*' 2>/dev/null | head -1)" 2>/dev/null)
  [ -n "$nccl" ] && [ -e "$nccl/libnccl.so.2" ] && export LD_LIBRARY_PATH="$nccl:$LD_LIBRARY_PATH"
fi
