#!/usr/bin/env bash
# The newer architectures on a GPU (docs/benchmarks.md, "Sliding windows and mixtures of experts
# on a GPU"): memplan-agent train, bf16, synthetic data, on scripts/configs' mistral-1b-window-1024
# (sliding-window tiles: 8 192 tokens over a 1 024 window, the planner's full-card plan) and
# qwen3-moe-1b-16x4 (16 experts, top 4, load-balancing loss on), each MoE plan twice: the experts
# as grouped GEMMs (the default) and as the per-expert loop (--moe-experts loop), before/after.
#   scripts/gpu-new-archs.sh OUT_DIR [BUILD_DIR] [ONLY]   (BUILD_DIR built by gpu-host-build.sh
#   with memplan-agent and agent_moe_test; default build-gpu, built here when missing; ONLY: run
#   only the runs whose label starts with it, e.g. "moe" for the four MoE runs and the test)
set -uo pipefail
out=${1:?usage: gpu-new-archs.sh OUT_DIR [BUILD_DIR] [ONLY]}; build=${2:-build-gpu}; only=${3:-}
mkdir -p "$out"
moe_test=$build/tests/agent/model/agent_moe_test
if [[ ! -x "$build/agent/cli/memplan-agent" || ! -x $moe_test ]]; then
  bash scripts/gpu-host-build.sh .gpu-debs "$build" memplan-agent agent_moe_test \
    > "$out/build.log" 2>&1 ||
    { tail -40 "$out/build.log"; exit 1; }
fi
# shellcheck disable=SC1091
source "$build/env.sh"
common=(--synthetic-data --device cuda --dtype bf16 --optimizer adamw_bf16 --clip 1 --lr 3e-4)
run() {
  local label=$1; shift
  [[ -n $only && $label != "$only"* ]] && return 0
  timeout --kill-after=5 150 "$build/agent/cli/memplan-agent" train "${common[@]}" "$@" \
    > "$out/$label.log" 2>&1
  echo "$label exit $?"
  grep -E 'msg="step"|msg="done"' "$out/$label.log" | sed -E 's/ts=[^ ]+ //' | cut -c1-260 | tail -4
}
# `memplan plan --arch-file scripts/configs/mistral-1b-window-1024 --gpu h200 --batch 2 --seq 8192
# --optimizer adamw_bf16 --grad-clipping`: every chunk persistent, no block mode (32 MiB chunks).
run window-8k --arch-file scripts/configs/mistral-1b-window-1024 --batch 2 --seq 8192 --steps 8 \
  --chunk-mib 32 --n-persist 66
run window-8k-hs --arch-file scripts/configs/mistral-1b-window-1024 --batch 2 --seq 8192 --steps 4 \
  --chunk-mib 32 --n-persist 45 --n-buffer 11 --n-ckpt 4 --n-hs-offload 1
for experts in grouped loop; do
  run "moe-2k-$experts" --arch-file scripts/configs/qwen3-moe-1b-16x4 --batch 4 --seq 2048 \
    --steps 8 --chunk-mib 32 --n-persist 16 --moe-experts "$experts"
  run "moe-2k-ckpt-$experts" --arch-file scripts/configs/qwen3-moe-1b-16x4 --batch 4 --seq 2048 \
    --steps 4 --chunk-mib 32 --n-persist 0 --n-buffer 8 --n-ckpt 8 --moe-experts "$experts"
done
# [Grouped experts] grouped against loop in bf16 on this GPU (agent/model/moe.cc).
if [[ -z $only || moe == "$only"* ]]; then
  "$moe_test" --gtest_filter='MoeExpertsGpuTest.*' > "$out/moe-test.log" 2>&1
  echo "agent_moe_test --gtest_filter='MoeExpertsGpuTest.*' exit $?"
  grep -E '^\[  (PASSED|FAILED|SKIPPED) |Failure' "$out/moe-test.log" | head -8
fi
