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
# MEMPLAN_LOOP_KERNEL_TRACE=1: each workload's last step (5) is traced (--kernel-trace
# --kernel-trace-step 5: the steps after a Kineto-traced one ran 50-70 % slower on an H200,
# so none follows it) and summarised
# by scripts/kernel-trace-summary.py into kernels-i.txt (device busy / idle, kernel count, time
# per kernel class); the JSON is kept only with MEMPLAN_LOOP_KEEP_TRACES=1. The traced step is
# left out of the measured step time.
# MEMPLAN_LOOP_FIRST_INDEX (default 1): the number of the first workload (its files' i), so that
# a loop split over several calls numbers its workloads as one.
# A workload whose FLAGs hold `--ranks N` (N > 1) trains N ranks under torchrun (one node, NCCL,
# --cpu-threads divided among them); MEMPLAN_LOOP_GPUS=N (default 1) benchmarks the card on N
# ranks at once, so the profile carries the collectives' bandwidth that several-rank plans need.
# Per workload i it writes the memory timeline of every step (timeline-i.tsv), the agent's per-step
# log lines (steps-i.txt: the `ts=` lines with fb_seconds and opt_seconds, left out of run-i.txt)
# and the stored plan with its prediction breakdown and measurement (plan-i.json).
set -uo pipefail
out=${1:?out dir}; build=${2:?build dir}; hw=${3:-h200}
mkdir -p "$out"
agent=$build/agent/cli/memplan-agent
source "$(dirname "$0")/start-planner.sh" "$out" "$build"
threads=$(nproc)
# NVLink multicast stays off on shared hosts (device tool, KINDS.md).
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
on_ranks() {  # N CMD...: CMD as one process (N = 1) or N ranks under torchrun, each bounded by
  local n=$1; shift  # MEMPLAN_LOOP_TIMEOUT seconds (default 0: no bound)
  local t=(timeout "${MEMPLAN_LOOP_TIMEOUT:-0}")
  if ((n > 1)); then "${t[@]}" torchrun --standalone --nproc-per-node "$n" --no-python "$@"; else "${t[@]}" "$@"; fi
}
on_ranks "${MEMPLAN_LOOP_GPUS:-1}" "$agent" bench --name "$hw" --planner "$addr" --out "$out/hw.json" \
  2>&1 | tee "$out/bench.txt"
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
  own=() n_ranks=1
  for ((k = 6; k <= $#; k++)); do
    if [[ ${!k} == --ranks ]]; then k=$((k + 1)); n_ranks=${!k}; else own+=("${!k}"); fi
  done
  timeline=(--memory-timeline "$out/timeline-$i.tsv")  # rank R > 0 of several: .rank-R
  [[ ${MEMPLAN_LOOP_KERNEL_TRACE:-0} == 1 ]] && timeline+=(--kernel-trace "$out/kernels-$i.json" --kernel-trace-step 5)
  if [[ -n ${5:-} && ${5:-} != - ]]; then
    python3 "$(dirname "$0")/cut-profile.py" "$out/hw.json" "$out/hw-$i.json" "$hw-cut-$i" "$5"
    profile_id=$("$build/planner/cli/memplan" --planner "$addr" --json hardware submit "$out/hw-$i.json" \
      | python3 -c 'import json, sys; d = json.load(sys.stdin); print(d.get("profile_id") or d.get("profileId"))')
    card=(--hardware-profile-id "$profile_id")
  fi
  data=(--synthetic-data)  # unless the workload's flags name its data (e.g. --synthetic-images)
  [[ " ${own[*]} " =~ \ --(synthetic-images|data|data-vl)\  ]] && data=()
  ranks_note=; ((n_ranks > 1)) && ranks_note="$n_ranks ranks"
  echo "=== $i: $1 ${2}x$3 ${4:+margin $4} ${5:+budget $5 GiB} ${own[*]} $ranks_note" | tee -a "$out/loop.txt"
  SECONDS=0
  on_ranks "$n_ranks" "$agent" train --planner "$addr" "${card[@]}" "${profile[@]}" --arch "$1" --batch "$2" --seq "$3" \
    "${margin[@]}" --steps 5 "${data[@]}" --device cuda --cpu-threads $((threads / n_ranks)) \
    "${timeline[@]}" "${extra[@]}" "${own[@]}" 2>&1 \
    | tee >(grep "^ts=" >"$out/steps-$i.txt") | grep -v "^ts=" | tee "$out/run-$i.txt" \
    >>"$out/loop.txt"
  echo "wall ${SECONDS} s" | tee -a "$out/loop.txt"
  if [[ -f $out/kernels-$i.json ]]; then
    python3 "$(dirname "$0")/kernel-trace-summary.py" "$out/kernels-$i.json" >"$out/kernels-$i.txt" 2>&1
    [[ ${MEMPLAN_LOOP_KEEP_TRACES:-0} == 1 ]] || rm -f "$out"/kernels-$i.json*
  fi
  grep -E "^(plan|predicted|measured|reported|profiled|device memory)" "$out/run-$i.txt"
  plan_id=$(sed -n 's/^plan_id \([^ ]*\).*/\1/p' "$out/run-$i.txt" | head -1)
  [[ -n $plan_id ]] && "$build/planner/cli/memplan" --planner "$addr" --json plans get "$plan_id" \
    >"$out/plan-$i.json" 2>&1
done
"$build/planner/cli/memplan" --planner "$addr" calibration 2>&1 | tee "$out/calibration.txt"
"$build/planner/cli/memplan" --planner "$addr" plans list 2>&1 | tee "$out/plans.txt"
