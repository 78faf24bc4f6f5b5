#!/usr/bin/env bash
# On a GPU host: the adapter and 8-bit-optimizer measurements (LoRA, QLoRA, AdamW8bit) beside
# transformers + PEFT (+ bitsandbytes).
#   scripts/gpu-adapters.sh OUT_DIR BUILD_DIR [HARDWARE_NAME] [PART ...]
# PARTs (default all): lora qlora adam8. Each planned workload runs through scripts/gpu-loop.sh
# (fresh planner, the card benchmarked, the plan for the card cut to MEMPLAN_ADAPTER_BUDGET_GIB,
# default 24). PEFT/bitsandbytes come from .whl/site when the host's Python lacks them (a folder
# of unpacked wheels carried to the host; see docs/benchmarks.md).
set -uo pipefail
out=${1:?out dir}; build=${2:?build dir}; hw=${3:-h100}
shift $(($# < 3 ? $# : 3))
parts=("$@"); ((${#parts[@]})) || parts=(lora qlora adam8)
budget=${MEMPLAN_ADAPTER_BUDGET_GIB:-24}
here=$(cd "$(dirname "$0")" && pwd)
[[ -d $here/../.whl/site ]] && export PYTHONPATH=$here/../.whl/site${PYTHONPATH:+:$PYTHONPATH}
mkdir -p "$out"
has() { local p; for p in "${parts[@]}"; do [[ $p == "$1" ]] && return 0; done; return 1; }
baseline() {  # NAME ARGS...: transformers (+ PEFT) on the full card, one JSON line kept
  local name=$1; shift
  echo "=== transformers $name: $*" | tee -a "$out/baselines.txt"
  python3 "$here/hf-train-baseline.py" "$@" >"$out/hf-$name.log" 2>&1
  tail -1 "$out/hf-$name.log" | tee -a "$out/baselines.txt"
}

if has lora; then
  MEMPLAN_LOOP_PROFILE= MEMPLAN_LOOP_CONFIGS="llama-3.1-8b 1 4096 0.05 $budget --lora-rank 16 --lora-alpha 32 --lora-targets all" \
    bash "$here/gpu-loop.sh" "$out/lora" "$build" "$hw"
  baseline lora-8b --preset llama-3.1-8b --batch 1 --seq 4096 --steps 8 --warmup 3 \
    --lora-rank 16 --lora-alpha 32
fi
if has qlora; then
  MEMPLAN_LOOP_PROFILE= MEMPLAN_LOOP_CONFIGS="qwen2.5-32b 1 2048 0.05 $budget --lora-rank 16 --lora-alpha 32 --lora-targets all --qlora" \
    bash "$here/gpu-loop.sh" "$out/qlora" "$build" "$hw"
  baseline qlora-32b --preset qwen2.5-32b --batch 1 --seq 2048 --steps 6 --warmup 2 \
    --lora-rank 16 --lora-alpha 32 --qlora
fi
if has adam8; then
  # Loss curves on real text: the same model, data and seed under adamw and adamw8bit (its
  # default stochastic rounding, and rounding to nearest as bitsandbytes does).
  python3 "$here/make-text-tokens.py" --out "$out/text.tok" | tee "$out/text.txt"
  for run in adamw adamw8bit adamw8bit-nearest; do
    args=(--optimizer "${run%-nearest}")
    [[ $run == *-nearest ]] && args+=(--param-rounding nearest)
    "$build/agent/cli/memplan-agent" train --arch qwen2.5-0.5b --data "$out/text.tok" \
      --batch 8 --seq 512 --steps 200 --lr 3e-4 "${args[@]}" --device cuda \
      --chunk-mib 64 --n-persist 1000 --log-every 1 >"$out/curve-$run.log" 2>&1
    tail -3 "$out/curve-$run.log"
  done
fi
