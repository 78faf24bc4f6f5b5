#!/usr/bin/env bash
# Issue 30's per-budget comparison on one GPU, every row in one call: llama-3.2-1b (tied) 4x2048,
# bf16, pure-bf16 AdamW, clipping at 1.0, random tokens. transformers eager with and without
# gradient checkpointing, FSDP2 + CPUOffloadPolicy + checkpointing (one rank), memplan --plain, and
# memplan's plans (the planner's analytic trace, first answer) for the card cut to each budget and
# for the full card. Each run: --steps steps, the first --warmup not counted; tokens/s from the
# median step, peak reserved the largest over the counted steps.
#   scripts/gpu-budgets.sh OUT_DIR BUILD_DIR [HARDWARE_NAME]
# MEMPLAN_BUDGETS (default "12 17 24"): the cut budgets in GiB. MEMPLAN_BUDGET_ARCH/BATCH/SEQ
# change the workload (a preset of both memplan and scripts/hf-train-baseline.py).
set -uo pipefail
out=${1:?out dir}; build=${2:?build dir}; hw=${3:-h200}
mkdir -p "$out"
agent=$build/agent/cli/memplan-agent
arch=${MEMPLAN_BUDGET_ARCH:-llama-3.2-1b}; batch=${MEMPLAN_BUDGET_BATCH:-4}; seq=${MEMPLAN_BUDGET_SEQ:-2048}
steps=12 warmup=3
table=$out/budgets.txt
source "$(dirname "$0")/start-planner.sh" "$out" "$build"
"$agent" bench --name "$hw" --planner "$addr" --out "$out/hw.json" >"$out/bench.txt" 2>&1 \
  || { echo "bench failed"; tail -5 "$out/bench.txt"; exit 1; }
printf '%-40s %10s %12s %10s\n' run budget tokens/s reserved_GiB | tee "$table"
hf() {  # LABEL BUDGET FLAGS...: one transformers / FSDP2 run
  local label=$1 budget=$2; shift 2
  timeout 300 python3 "$(dirname "$0")/hf-train-baseline.py" --preset "$arch" --batch "$batch" \
    --seq "$seq" --steps $steps --warmup $warmup "$@" >"$out/$label.log" 2>&1
  python3 - "$out/$label.log" "$label" "$budget" <<'PY' | tee -a "$table"
import json, sys
rows = [l for l in open(sys.argv[1]) if l.startswith("{")]
if not rows:
    print(f"{sys.argv[2]:40} {sys.argv[3]:>10} {'failed':>12}")
else:
    r = json.loads(rows[-1])
    print(f"{sys.argv[2]:40} {sys.argv[3]:>10} {r['tokens_per_s']:12.0f} {r['peak_reserved_gib']:10.2f}")
PY
}
mp() {  # LABEL BUDGET FLAGS...: one memplan-agent train run
  local label=$1 budget=$2; shift 2
  timeout 300 "$agent" train --arch "$arch" --batch "$batch" --seq "$seq" --synthetic-data \
    --steps $steps --optimizer adamw_bf16 --clip 1 --device cuda "$@" >"$out/$label.log" 2>&1
  python3 - "$out/$label.log" "$label" "$budget" $warmup $((batch * seq)) <<'PY' | tee -a "$table"
import re, statistics, sys
path, label, budget, warmup, tokens = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4]), int(sys.argv[5])
steps = [l for l in open(path) if 'msg="step"' in l][warmup:]
if not steps:
    print(f"{label:40} {budget:>10} {'failed':>12}")
else:
    sec = statistics.median(float(re.search(r" seconds=([0-9.e+-]+)", l).group(1)) for l in steps)
    res = max(int(re.search(r"peak_reserved_bytes=(\d+)", l).group(1)) for l in steps)
    print(f"{label:40} {budget:>10} {tokens / sec:12.0f} {res / 2**30:10.2f}")
PY
}
hf "transformers eager" full --no-checkpointing
hf "transformers + checkpointing" full
hf "fsdp2 cpu-offload + checkpointing" full --fsdp2-offload
mp "memplan --plain" full --plain
for gib in ${MEMPLAN_BUDGETS:-12 17 24}; do
  python3 "$(dirname "$0")/cut-profile.py" "$out/hw.json" "$out/hw-$gib.json" "$hw-cut-$gib" "$gib"
  id=$("$build/planner/cli/memplan" --planner "$addr" --json hardware submit "$out/hw-$gib.json" \
    | python3 -c 'import json, sys; d = json.load(sys.stdin); print(d.get("profile_id") or d.get("profileId"))')
  mp "memplan plan for $gib GiB" "$gib" --planner "$addr" --hardware-profile-id "$id"
done
mp "memplan plan for the full card" full --planner "$addr" --hardware "$hw"
