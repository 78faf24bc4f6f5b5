#!/usr/bin/env bash
# On-demand profiling on a GPU host (ProTrain §3.2): profiles a model whose parameters alone are
# larger than the card with the parameters in host memory, prints its size against the card,
# plans from the on-demand trace, and compares an on-demand profile with a resident one on a
# model that fits.
#   scripts/gpu-ondemand.sh OUT_DIR BUILD_DIR [HARDWARE_NAME]
# MEMPLAN_ONDEMAND_LAYERS: layers of the large model (a Llama-3.1-70B shape; default 52, 93 GB
# of bf16 parameters). MEMPLAN_ONDEMAND_FIT: "ARCH BATCH SEQ" of the comparison (default
# llama-3.2-3b 2 4096).
set -uo pipefail
out=${1:?out dir}; build=${2:?build dir}; hw=${3:-h100-80gb}
mkdir -p "$out"
agent=$build/agent/cli/memplan-agent
layers=${MEMPLAN_ONDEMAND_LAYERS:-52}
cat >"$out/large-config.json" <<JSON
{"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 8192,
 "num_hidden_layers": $layers, "num_attention_heads": 64, "num_key_value_heads": 8,
 "intermediate_size": 28672, "vocab_size": 128256, "tie_word_embeddings": false,
 "rope_theta": 500000.0, "rms_norm_eps": 1e-5, "max_position_embeddings": 131072,
 "_name_or_path": "llama-70b-shape-${layers}-layers"}
JSON
source "$(dirname "$0")/start-planner.sh" "$out" "$build"
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader | tee "$out/gpu.txt"
free -g | tee -a "$out/gpu.txt"
"$agent" bench --name "$hw" --planner "$addr" --out "$out/hw.json" >"$out/bench.txt" 2>&1
echo "=== comparison on a model that fits: resident vs on-demand"
set -- ${MEMPLAN_ONDEMAND_FIT:-llama-3.2-3b 2 4096}
for mode in resident on-demand; do
  flags=(); [[ $mode == on-demand ]] && flags=(--on-demand)
  SECONDS=0
  "$agent" profile --arch "$1" --batch "$2" --seq "$3" --dtype bf16 --device cuda \
    --hardware "$hw" "${flags[@]}" --out "$out/fit-$mode.json" 2>&1 | grep -v "^ts=" \
    >"$out/fit-$mode.txt"
  echo "$mode: ${SECONDS} s"; grep -E "^(model|on-demand|forward_end|model built|device)" "$out/fit-$mode.txt"
done
echo "=== the large model against the card"
python3 - "$out/large-config.json" <<'PY' | tee "$out/large-size.txt"
import json, sys, torch
c = json.load(open(sys.argv[1]))
h, i, v, L = c["hidden_size"], c["intermediate_size"], c["vocab_size"], c["num_hidden_layers"]
kv = h // c["num_attention_heads"] * c["num_key_value_heads"]
n = 2 * v * h + h + L * (2 * h * h + 2 * h * kv + 3 * h * i + 2 * h)
card = torch.cuda.get_device_properties(0).total_memory
print(f"parameters {n / 1e9:.2f} B = {2 * n / 2**30:.1f} GiB in bf16 (gradients as much again); "
      f"card {card / 2**30:.1f} GiB: the parameters alone are {2 * n / card:.2f}x the card")
PY
echo "=== on-demand profile of the large model"
SECONDS=0
"$agent" profile --arch-file "$out/large-config.json" --batch 1 --seq 2048 --dtype bf16 \
  --device cuda --hardware "$hw" --on-demand --chunk-bytes $((1 << 30)) --planner "$addr" \
  --out "$out/large-ondemand.json" 2>&1 | grep -v "^ts=" | tee "$out/large-ondemand.txt" \
  | grep -E "^(model|on-demand|forward_end|model built|device|trace_id|block 0 |head)"
echo "wall ${SECONDS} s"
trace_id=$(sed -n 's/^trace_id //p' "$out/large-ondemand.txt")
if [[ -n $trace_id ]]; then
  "$build/planner/cli/memplan" --planner "$addr" plan --trace-id "$trace_id" --gpu "$hw" \
    2>&1 | tee "$out/large-plan.txt" | head -30
fi
