#!/usr/bin/env bash
# Long-sequence figures on a GPU host, in one call (docs/benchmarks.md, "The longest sequence"):
# builds memplan-agent, then runs full fine-tunes on synthetic data (adamw_bf16, clip 1) with the
# knobs of the planner's plans, one per line of MEMPLAN_LONG_RUNS: "label seq steps args...",
# args being the model (--arch / --arch-file), the plan's knobs and --memory-limit.
#   scripts/gpu-long-seq.sh OUT_DIR
set -uo pipefail
out=${1:?usage: gpu-long-seq.sh OUT_DIR}
mkdir -p "$out"
log=$out/long.log
say() { echo "[long-seq +${SECONDS}s] $*" | tee -a "$log"; }
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee -a "$log"
free -g | tee -a "$log"
if ! bash scripts/gpu-host-build.sh .gpu-debs build-gpu memplan-agent >>"$log" 2>&1; then
  say "build failed"; tail -30 "$log"; exit 1
fi
# shellcheck disable=SC1091
source build-gpu/env.sh
torch_lib=$(python3 -c 'import os, torch; print(os.path.join(os.path.dirname(torch.__file__), "lib"))')
export LD_LIBRARY_PATH=$torch_lib:$torch_lib/../../nvidia/cu13/lib:$LD_LIBRARY_PATH
while read -r label seq steps args; do
  [[ -z "$label" || "$label" == \#* ]] && continue
  say "$label seq $seq steps $steps: $args"
  # shellcheck disable=SC2086
  /usr/bin/time -v timeout --kill-after=5 "${MEMPLAN_LONG_TIMEOUT:-400}" \
    build-gpu/agent/cli/memplan-agent train --synthetic-data --batch 1 --seq "$seq" \
    --steps "$steps" --optimizer adamw_bf16 --clip 1 --device cuda $args \
    >"$out/$label.log" 2>&1
  say "$label exit $?"
  grep -E "^  step|step [0-9]+/|peak|reserved|Maximum resident" "$out/$label.log" | tail -12 | tee -a "$log"
done <<<"${MEMPLAN_LONG_RUNS:?MEMPLAN_LONG_RUNS: lines of label seq steps args}"
say "done"
