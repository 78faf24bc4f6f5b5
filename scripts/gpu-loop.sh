#!/usr/bin/env bash
# Closes the loop on a GPU host: starts memplan-planner, benchmarks the card (stored as a measured
# profile that supersedes the preset of the same name), then for each workload profiles the
# model, asks for a plan, trains it and reports the measurement; prints the calibration at the end.
#   scripts/gpu-loop.sh OUT_DIR BUILD_DIR [HARDWARE_NAME]
# MEMPLAN_LOOP_CONFIGS: ';'-separated "ARCH BATCH SEQ [SAFETY_MARGIN [BUDGET_GIB [FLAG ...]]]"
# workloads (default below); FLAGs go to that workload's `memplan-agent train` (e.g. --lora-rank 16
# --lora-targets all); "-" for MARGIN or BUDGET_GIB leaves it at its default. BUDGET_GIB plans for the benchmarked card cut to that much memory: a copy of
# the measured profile with that gpu_memory_bytes, stored under a name of its own
# (HARDWARE_NAME-cut-i), so the plan's first prediction is uncalibrated.
# MEMPLAN_LOOP_PROFILE (default --profile): how the model is traced; empty = the planner's
# analytic trace of the architecture.
# MEMPLAN_LOOP_TRAIN_FLAGS: extra flags for every `memplan-agent train` (e.g. --allocator-conf=).
# MEMPLAN_LOOP_FIRST_INDEX (default 1): the number of the first workload (its files' i), so that
# a loop split over several calls numbers its workloads as one.
# Per workload i it writes the memory timeline of every step (timeline-i.tsv), the agent's per-step
# log lines (steps-i.txt: the `ts=` lines with fb_seconds and opt_seconds, left out of run-i.txt)
# and the stored plan with its prediction breakdown and measurement (plan-i.json).
set -uo pipefail
out=${1:?out dir}; build=${2:?build dir}; hw=${3:-h200}
mkdir -p "$out"
agent=$build/agent/cli/memplan-agent
source "$(dirname "$0")/start-planner.sh" "$out" "$build"
threads=$(nproc)
"$agent" bench --name "$hw" --planner "$addr" --out "$out/hw.json" 2>&1 | tee "$out/bench.txt"
configs=${MEMPLAN_LOOP_CONFIGS:-llama-3.2-1b 4 2048;llama-3.2-1b 2 4096;llama-3.2-3b 1 4096;qwen2.5-1.5b 4 2048}
IFS=';' read -ra workloads <<<"$configs"
extra=(${MEMPLAN_LOOP_TRAIN_FLAGS:-})
profile=(${MEMPLAN_LOOP_PROFILE---profile})
i=$((${MEMPLAN_LOOP_FIRST_INDEX:-1} - 1))
for cfg in "${workloads[@]}"; do
  set -- $cfg
  i=$((i + 1))
  margin=()
  [[ -n ${4:-} && ${4:-} != - ]] && margin=(--safety-margin "$4")
  card=(--hardware "$hw")
  own=("${@:6}")
  if [[ -n ${5:-} && ${5:-} != - ]]; then
    python3 "$(dirname "$0")/cut-profile.py" "$out/hw.json" "$out/hw-$i.json" "$hw-cut-$i" "$5"
    profile_id=$("$build/planner/cli/memplan" --planner "$addr" --json hardware submit "$out/hw-$i.json" \
      | python3 -c 'import json, sys; d = json.load(sys.stdin); print(d.get("profile_id") or d.get("profileId"))')
    card=(--hardware-profile-id "$profile_id")
  fi
  echo "=== $i: $1 ${2}x$3 ${4:+margin $4} ${5:+budget $5 GiB} ${own[*]}" | tee -a "$out/loop.txt"
  SECONDS=0
  "$agent" train --planner "$addr" "${card[@]}" "${profile[@]}" --arch "$1" --batch "$2" --seq "$3" \
    "${margin[@]}" --steps 5 --synthetic-data --device cuda --cpu-threads "$threads" \
    --memory-timeline "$out/timeline-$i.tsv" "${extra[@]}" "${own[@]}" 2>&1 \
    | tee >(grep "^ts=" >"$out/steps-$i.txt") | grep -v "^ts=" | tee "$out/run-$i.txt" \
    >>"$out/loop.txt"
  echo "wall ${SECONDS} s" | tee -a "$out/loop.txt"
  grep -E "^(plan|predicted|measured|reported|profiled|device memory)" "$out/run-$i.txt"
  plan_id=$(sed -n 's/^plan_id //p' "$out/run-$i.txt")
  [[ -n $plan_id ]] && "$build/planner/cli/memplan" --planner "$addr" --json plans get "$plan_id" \
    >"$out/plan-$i.json" 2>&1
done
"$build/planner/cli/memplan" --planner "$addr" calibration 2>&1 | tee "$out/calibration.txt"
"$build/planner/cli/memplan" --planner "$addr" plans list 2>&1 | tee "$out/plans.txt"
