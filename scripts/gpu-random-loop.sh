#!/usr/bin/env bash
# The held-out accuracy loop: draws N workloads at random from SEED and closes the loop on each
# (profile -> plan -> train -> measure) with scripts/gpu-loop.sh, every one planned for a card of
# its own (the benchmarked card cut to a random budget, a profile name of its own), so every
# prediction is a first, uncalibrated one. Then prints the loop-report table and the error
# distribution (loop-report.py --summary).
#   scripts/gpu-random-loop.sh SEED N OUT_DIR BUILD_DIR [HARDWARE_NAME]
# Draws (scripts/random-workloads.py): a model preset whose full AdamW state fits the host's
# memory, a sequence, a micro-batch, a budget in [16 GiB, the card] (MEMPLAN_RANDOM_MAX_GIB,
# default the card's memory as torch reports it) and a safety margin. MEMPLAN_RANDOM_MODELS
# replaces the model list (space-separated presets).
# MEMPLAN_RANDOM_KNOBS=1 also draws knobs the planner rarely picks by itself, fixed in its search
# ([Fixed knobs with --planner]): --host-memory pageable or --n-swap 1..4.
# MEMPLAN_RANDOM_ENVELOPE=1 draws from the envelope users run instead (scripts/random-workloads.py
# --envelope: full fine-tunes 0.5-14 B with every optimizer, LoRA and QLoRA 7-32 B, clipping on
# and off, sequences up to 65 536, a third of the draws on every GPU of the host when it has
# several), planned from the analytic trace unless MEMPLAN_LOOP_PROFILE says otherwise;
# MEMPLAN_RANDOM_HOST_GIB (default 120) bounds the full fine-tunes' host state.
# MEMPLAN_RANDOM_FIRST=K (default 1) runs draws K..N only (the draws before K are still drawn, so
# the workloads are the seed's): a loop longer than one device call runs as several, their files
# numbered by draw (MEMPLAN_LOOP_FIRST_INDEX), mergeable into one folder for loop-report.py.
# MEMPLAN_RANDOM_AFTER=DIR[:DIR...] picks K itself from earlier calls' folders (see below).
set -uo pipefail
seed=${1:?seed}; n=${2:?count}; out=${3:?out dir}; build=${4:?build dir}; hw=${5:-gpu}
mkdir -p "$out"
card_gib=${MEMPLAN_RANDOM_MAX_GIB:-$(python3 -c \
  'import torch; print(torch.cuda.get_device_properties(0).total_memory / 2**30)' 2>/dev/null)}
[[ -n $card_gib ]] || { echo "no GPU found: set MEMPLAN_RANDOM_MAX_GIB"; exit 2; }
models=${MEMPLAN_RANDOM_MODELS:-llama-3.2-1b llama-3.2-3b qwen2.5-0.5b qwen2.5-1.5b qwen2.5-3b qwen3-0.6b qwen3-1.7b qwen3-4b}
knob_flag=(); [[ ${MEMPLAN_RANDOM_KNOBS:-0} == 1 ]] && knob_flag=(--knobs)
envelope=()
if [[ ${MEMPLAN_RANDOM_ENVELOPE:-0} == 1 ]]; then
  gpus=$(nvidia-smi -L 2>/dev/null | wc -l)
  envelope=(--envelope --gpus "${MEMPLAN_RANDOM_GPUS:-${gpus:-1}}" --host-gib "${MEMPLAN_RANDOM_HOST_GIB:-120}")
  export MEMPLAN_LOOP_GPUS=${MEMPLAN_RANDOM_GPUS:-${gpus:-1}}
  export MEMPLAN_LOOP_PROFILE=${MEMPLAN_LOOP_PROFILE-}  # the analytic trace: the first answer
fi
configs=$(python3 "$(dirname "$0")/random-workloads.py" "$seed" "$n" "$card_gib" "${knob_flag[@]}" \
  "${envelope[@]}" $models)
echo "seed $seed: $configs" | tee "$out/draws.txt"
first=${MEMPLAN_RANDOM_FIRST:-1}
# MEMPLAN_RANDOM_AFTER=DIR[:DIR...]: go on after earlier calls' output folders: the first draw is
# the one after the highest-numbered draw whose run reported a measurement there (a draw a call's
# time limit cut is run again).
if [[ -n ${MEMPLAN_RANDOM_AFTER:-} ]]; then
  first=$(python3 - "$MEMPLAN_RANDOM_AFTER" <<'PY'
import os, re, sys
done = 0
for d in sys.argv[1].split(":"):
    for f in os.listdir(d) if os.path.isdir(d) else []:
        m = re.fullmatch(r"run-(\d+)\.txt", f)
        if m and "reported:" in open(os.path.join(d, f), errors="replace").read():
            done = max(done, int(m.group(1)))
print(done + 1)
PY
)
  echo "going on after ${MEMPLAN_RANDOM_AFTER}: first draw $first"
  if (( first > n )); then echo "every draw of seed $seed has run"; exit 0; fi
fi
configs=$(python3 -c 'import sys; print(";".join(sys.argv[2].split(";")[int(sys.argv[1]) - 1:]))' \
  "$first" "$configs")
MEMPLAN_LOOP_FIRST_INDEX=$first MEMPLAN_LOOP_CONFIGS=$configs bash "$(dirname "$0")/gpu-loop.sh" "$out" "$build" "$hw"
python3 "$(dirname "$0")/loop-report.py" "$out" --summary | tee "$out/report.txt"
