#!/usr/bin/env bash
# Runs the agent training benchmarks of issue 3 on a GPU host in one go (docs/benchmarks.md,
# "Agent training on the GPU host") and writes results.jsonl, results.txt and bench.log to OUT_DIR.
#   scripts/gpu-bench.sh OUT_DIR [PREBUILT_BINARY]
# PREBUILT_BINARY: a memplan-train-bench built elsewhere against the same torch (2.11.0+cu130); it
# is used when it starts here (Debian runtime libraries from .gpu-debs), else the script builds
# with scripts/gpu-host-build.sh. Runs are ordered by importance and each is skipped once the time
# budget (BENCH_BUDGET_S, default 480 s from the start, build included) would be exceeded.
set -uo pipefail
out=${1:?usage: gpu-bench.sh OUT_DIR [PREBUILT_BINARY]}
prebuilt=${2:-}
budget_s=${BENCH_BUDGET_S:-480}
start_s=$SECONDS
mkdir -p "$out"
log=$out/bench.log
: >"$out/results.jsonl"
: >"$out/results.txt"
say() { echo "[gpu-bench +$((SECONDS - start_s))s] $*" | tee -a "$log"; }

torch_lib=$(python3 -c 'import os, torch; print(os.path.join(os.path.dirname(torch.__file__), "lib"))')
deps=/opt/deps
if [[ ! -d $deps/usr/lib/x86_64-linux-gnu ]]; then
  mkdir -p "$deps"
  for f in .gpu-debs/*.deb; do dpkg -x "$f" "$deps"; done
fi
# A binary built against the torch wheel links libcudart from the wheel's nvidia/cu13 folder.
export LD_LIBRARY_PATH=$torch_lib:$torch_lib/../../nvidia/cu13/lib:$deps/usr/lib/x86_64-linux-gnu:${LD_LIBRARY_PATH:-}
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee -a "$log"
say "cpus $(nproc), torch $(python3 -c 'import torch; print(torch.__version__)')"

bin=
if [[ -n $prebuilt && -x $prebuilt ]] && "$prebuilt" --help >/dev/null 2>>"$log"; then
  bin=$prebuilt
  say "using prebuilt $bin"
else
  say "building memplan-train-bench"
  if ! bash scripts/gpu-host-build.sh .gpu-debs build-gpu memplan-train-bench >>"$log" 2>&1; then
    say "build failed"; tail -30 "$log"; exit 1
  fi
  # shellcheck disable=SC1091
  source build-gpu/env.sh
  bin=build-gpu/agent/bench/memplan-train-bench
fi
say "binary ready"

# run LIMIT_S ARGS...: one benchmark process, bounded by LIMIT_S and by what is left of the budget.
run() {
  local limit=$1; shift
  local left=$((budget_s - (SECONDS - start_s)))
  if ((left < 20)); then say "SKIPPED (budget): $*"; return; fi
  ((limit > left)) && limit=$left
  say "run (limit ${limit}s): $*"
  timeout --kill-after=5 "$limit" "$bin" --out "$out/results.jsonl" "$@" \
    > >(tee -a "$out/results.txt" "$log") 2>>"$log"
  local rc=$?
  ((rc != 0)) && say "exit $rc: $*"
}

# The anchors' 1B (hidden 2048, 16 layers, 32/8 heads, inter 8192, vocab 128256) is a random-init
# transformers LlamaConfig, whose default is an untied head: llama-3.2-1b with the head untied.
one_b=(--arch llama-3.2-1b --tie-embeddings false --batch 4 --seq 2048 --dtype bf16 --device cuda)
# a. unmanaged eager vs managed all-persistent, no checkpointing.
run 90 "${one_b[@]}" --warmup 3 --steps 5 --mode unmanaged --label a-1b-unmanaged
run 90 "${one_b[@]}" --warmup 3 --steps 5 --mode managed --chunk-mib 128 --n-persist -1 \
  --label a-1b-managed-persistent
# b + d. everything offloaded (pinned), checkpoint on every block; uploads timed.
run 120 "${one_b[@]}" --warmup 3 --steps 5 --mode managed --chunk-mib 128 --n-persist 0 \
  --n-buffer 2 --block-modes all:ckpt --measure-h2d --label b-1b-offload-ckpt
# c. 8B, 1x16384: CKPT on every block vs HS_OFFLOAD on every block, one unmanaged model.
run 240 --arch llama-3.1-8b --batch 1 --seq 16384 --dtype bf16 --device cuda --warmup 2 --steps 3 \
  --mode unmanaged --variants 'ckpt=all:ckpt;hs_offload=all:hs_offload' --label c-8b-16k
# b, other plans.
run 100 "${one_b[@]}" --warmup 3 --steps 5 --mode managed --chunk-mib 128 --n-persist 0 \
  --n-buffer 2 --block-modes all:hs_offload --label b-1b-offload-hs
run 100 "${one_b[@]}" --warmup 3 --steps 5 --mode managed --chunk-mib 128 --n-persist 0 \
  --n-buffer 3 --block-modes all:ckpt --label b-1b-offload-ckpt-3buf
say "done"
