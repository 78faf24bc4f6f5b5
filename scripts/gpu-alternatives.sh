#!/usr/bin/env bash
# Times the plan the search picked against every alternative it listed, on the GPU host: the
# "is the pick within 5 % of the fastest alternative" check of issue 4.
#   scripts/gpu-alternatives.sh OUT_DIR BUILD_DIR PLAN_JSON ARCH BATCH SEQ
# PLAN_JSON is `memplan --json plans get ID` output (gpu-loop.sh writes one per workload as
# plan-i.json). Each plan trains 4 steps (the first is warm-up) with the chunk manager.
# MEMPLAN_ALT_ONLY="alt3 alt4": run only these (pick, alt1, ...); MEMPLAN_ALT_DEVICE: cpu|cuda.
set -uo pipefail
out=${1:?out dir}; build=${2:?build dir}; plan_json=${3:?plan json}
arch=${4:?arch}; batch=${5:?batch}; seq=${6:?seq}
mkdir -p "$out"
agent=$build/agent/cli/memplan-agent
python3 - "$plan_json" "$out" <<'PY'
import json, sys
stored = json.load(open(sys.argv[1]))["plan"]
resp = stored["response"]
rows = [("pick", {"plan": resp["plan"], "prediction": resp["prediction"]})]
rows += [(f"alt{i + 1}", a) for i, a in enumerate(resp.get("alternatives", []))]
for name, entry in rows:
    json.dump(entry, open(f"{sys.argv[2]}/{name}.json", "w"))
    p, pred = entry["plan"], entry["prediction"]
    print(name, pred.get("iteration_seconds", 0), pred.get("peak_bytes", 0),
          f'persist={p.get("n_persist", 0)}/{p.get("n_chunks", 0)} buffer={p.get("n_buffer", 0)} '
          f'swap={p.get("n_swap", 0)} ckpt={p.get("n_checkpoint", 0)} hs={p.get("n_hs_offload", 0)}',
          file=open(f"{sys.argv[2]}/{name}.txt", "w"))
PY
printf '%-6s %-48s %12s %12s %14s %14s\n' plan knobs pred_s meas_s pred_peak_MiB reserved_MiB \
  | tee "$out/alternatives.txt"
for f in "$out"/pick.json "$out"/alt*.json; do
  [[ -f $f ]] || continue
  name=$(basename "$f" .json)
  if [[ -n ${MEMPLAN_ALT_ONLY:-} && " $MEMPLAN_ALT_ONLY " != *" $name "* ]]; then continue; fi
  read -r _ pred_s pred_peak knobs <"$out/$name.txt"
  "$agent" train --plan-file "$f" --arch "$arch" --batch "$batch" --seq "$seq" --steps 4 \
    --synthetic-data --device ${MEMPLAN_ALT_DEVICE:-cuda} --cpu-threads "$(nproc)" >"$out/$name.log" 2>&1
  # Steady step time: mean of the step lines after the first.
  meas_s=$(grep -o 'msg="step".*' "$out/$name.log" | sed -n 's/.*seconds=\([0-9.e+-]*\).*/\1/p' \
    | tail -n +2 | awk '{s += $1; n++} END {if (n) printf "%.4f", s / n; else print "failed"}')
  reserved=$(grep -o 'msg="step".*' "$out/$name.log" | sed -n 's/.*peak_reserved_bytes=\([0-9]*\).*/\1/p' \
    | tail -n +2 | sort -n | tail -1)
  printf '%-6s %-48s %12.4f %12s %14.0f %14.0f\n' "$name" "$knobs" "$pred_s" "$meas_s" \
    "$(echo "$pred_peak" | awk '{print $1 / 1048576}')" "$(echo "${reserved:-0}" | awk '{print $1 / 1048576}')" \
    | tee -a "$out/alternatives.txt"
done
