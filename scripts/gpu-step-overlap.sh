#!/usr/bin/env bash
# Step-time figures for clipped training and the CPU optimizer passes on a GPU host, in one call
# (docs/benchmarks.md, "Clipping keeps the overlap"): builds memplan-train-bench and
# memplan-cpu-adam-bench, times the CPU optimizer passes, then llama-3.1-8b 1x4096 with the planner's 40 GiB adamw_bf16 plan under
# --clip 0, --clip 1 ([Deferred CPU updates]) and --clip 1 --wait-step-updates (the old path).
#   scripts/gpu-step-overlap.sh OUT_DIR
# MEMPLAN_OVERLAP_OPTIMIZERS: optimizers of the 8B runs (default "adamw_bf16 adamw8bit").
# MEMPLAN_OVERLAP_VARIANTS: which runs (default "clip0 clip0-waiting clip1-deferred clip1-waiting";
# clip0 defers the updates still running after backward, clip0-waiting waits for them in Step();
# clip1-speculative and clip50-speculative add --speculative-clip ([Speculative clipped updates]),
# clip50-deferred is the deferred step with a threshold of 50).
# MEMPLAN_OVERLAP_DEVICE_SHARES: shares of --device-update-share ([Device updates of offloaded
# chunks]) to run with --clip 1 as variants clip1-device<share> (listed in the variants to run).
# MEMPLAN_OVERLAP_SKIP_CPU_BENCH=1 leaves out the CPU optimizer passes.
set -uo pipefail
out=${1:?usage: gpu-step-overlap.sh OUT_DIR}
mkdir -p "$out"
log=$out/overlap.log
say() { echo "[step-overlap +${SECONDS}s] $*" | tee -a "$log"; }
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee -a "$log"
say "cpus $(nproc): $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2)"
if ! bash scripts/gpu-host-build.sh .gpu-debs build-gpu memplan-train-bench \
    memplan-cpu-adam-bench >>"$log" 2>&1; then
  say "build failed"; tail -30 "$log"; exit 1
fi
# shellcheck disable=SC1091
source build-gpu/env.sh
torch_lib=$(python3 -c 'import os, torch; print(os.path.join(os.path.dirname(torch.__file__), "lib"))')
export LD_LIBRARY_PATH=$torch_lib:$torch_lib/../../nvidia/cu13/lib:$LD_LIBRARY_PATH
if [[ ${MEMPLAN_OVERLAP_SKIP_CPU_BENCH:-0} != 1 ]]; then
  say "cpu optimizer passes (64M parameters)"
  build-gpu/agent/chunks/memplan-cpu-adam-bench 67108864 "$(nproc)" 2>&1 | tee -a "$log" "$out/cpu-adam.txt"
fi
device_variants=()
for share in ${MEMPLAN_OVERLAP_DEVICE_SHARES:-}; do
  device_variants+=("clip1-device$share:--clip 1 --device-update-share $share")
done
# The plan `memplan plan --arch llama-3.1-8b --gpu a100-40gb --batch 1 --seq 4096
# --optimizer adamw_bf16 --grad-clipping` answers: chunk 128 MiB, 68 persistent, 8 buffers,
# 3 checkpointed and 23 hidden-state-offloaded blocks.
plan=(--arch llama-3.1-8b --batch 1 --seq 4096 --dtype bf16 --device cuda --mode managed
      --chunk-mib 128 --n-persist 68 --n-buffer 8 --n-ckpt 3 --n-hs-offload 23
      --warmup 2 --steps 4)
for opt in ${MEMPLAN_OVERLAP_OPTIMIZERS:-adamw_bf16 adamw8bit}; do
  for variant in "clip0:--clip 0" "clip0-waiting:--clip 0 --wait-step-updates" \
      "clip1-deferred:--clip 1" "clip1-waiting:--clip 1 --wait-step-updates" \
      "clip1-speculative:--clip 1 --speculative-clip" "clip50-deferred:--clip 50" \
      "clip50-speculative:--clip 50 --speculative-clip" "${device_variants[@]}"; do
    label=${variant%%:*}
    wanted=${MEMPLAN_OVERLAP_VARIANTS:-clip0 clip0-waiting clip1-deferred clip1-waiting}
    [[ " $wanted " == *" $label "* ]] || continue
    # shellcheck disable=SC2206
    extra=(${variant#*:})
    say "8B $opt $label"
    timeout --kill-after=5 240 build-gpu/agent/bench/memplan-train-bench "${plan[@]}" \
      --optimizer "$opt" "${extra[@]}" --label "8b-$opt-$label" --out "$out/results.jsonl" \
      2>>"$log" | tee -a "$log" "$out/results.txt"
  done
done
say "done"
