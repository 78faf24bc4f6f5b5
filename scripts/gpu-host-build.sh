#!/usr/bin/env bash
# Builds memplan on an offline GPU host that has CUDA, a CUDA build of PyTorch and a compiler, with
# the Debian packages carried in as .deb files (see docs/benchmarks.md, "Reproducing").
#   scripts/gpu-host-build.sh DEBS_DIR BUILD_DIR [cmake --build targets...]
# MEMPLAN_HOST_CMAKE_ARGS: more configure arguments (a new build folder only), e.g. the
# sanitizer build of scripts/sanitize.sh's agent-asan: "-DCMAKE_BUILD_TYPE=Debug
# -DMEMPLAN_SANITIZE=address".
set -euo pipefail
debs=${1:?debs dir}; build=${2:?build dir}; shift 2
prefix=/opt/deps
mkdir -p "$prefix"
for f in "$debs"/*.deb; do dpkg -x "$f" "$prefix"; done
lib=$prefix/usr/lib/x86_64-linux-gnu
export PATH=$prefix/usr/bin:$PATH LD_LIBRARY_PATH=$lib:${LD_LIBRARY_PATH:-} LIBRARY_PATH=$lib
torch_prefix=$(python3 -c 'import torch; print(torch.utils.cmake_prefix_path)')
if [[ ! -f $build/build.ninja ]]; then
  cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DMEMPLAN_BUILD_AGENT=ON \
    -DCMAKE_PREFIX_PATH="$torch_prefix;$prefix/usr" -DTORCH_CUDA_ARCH_LIST=9.0 \
    -DProtobuf_PROTOC_EXECUTABLE="$prefix/usr/bin/protoc" ${MEMPLAN_HOST_CMAKE_ARGS:-} | tail -3
fi
targets=()
for t in "$@"; do targets+=(--target "$t"); done
cmake --build "$build" -j "$(nproc)" "${targets[@]}"
printf 'export LD_LIBRARY_PATH=%s:${LD_LIBRARY_PATH:-}\nexport PATH=%s/usr/bin:$PATH\n' "$lib" "$prefix" \
  > "$build/env.sh"
