#!/usr/bin/env bash
# On a GPU host: the bf16 parity suite against transformers on the GPU, then memplan-agent train
# (pure-bf16 AdamW, every parameter on the device, every block checkpointed) side by side with
# transformers' own training step (scripts/hf-train-baseline.py) at the same batch.
#   scripts/gpu-parity.sh OUT_DIR [BUILD_DIR] [PRESET BATCH SEQ]
# Needs .gpu-debs (../shared/gpu-host/fetch-debs.sh) and a python3 with torch + transformers.
set -euo pipefail
out=${1:?out dir}; build=${2:-build-gpu}
preset=${3:-llama-3.2-1b}; batch=${4:-4}; seq=${5:-2048}
mkdir -p "$out"
bash scripts/gpu-host-build.sh .gpu-debs "$build" memplan-agent memplan-hf-parity > "$out/build.log" 2>&1 \
  || { tail -40 "$out/build.log"; exit 1; }
source "$build/env.sh"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee "$out/gpu.txt"

echo "== bf16 parity on the GPU"
PYTHONUNBUFFERED=1 python3 tests/parity/hf_parity_test.py --tool "$build/tests/parity/memplan-hf-parity" \
  --dtype bf16 --device cuda --work /tmp/memplan-parity > "$out/parity-bf16-cuda.log" 2>&1 || true
grep -E "FAIL|passed" "$out/parity-bf16-cuda.log" | tail -15

layers=$(python3 - "$preset" <<'EOF'
import sys
sys.path.insert(0, "scripts")
import importlib.util
spec = importlib.util.spec_from_file_location("b", "scripts/hf-train-baseline.py")
b = importlib.util.module_from_spec(spec); spec.loader.exec_module(b)
print(b.PRESETS[sys.argv[1]]["num_hidden_layers"])
EOF
)
steps=15
echo "== memplan-agent train $preset ${batch}x${seq}: adamw_bf16, all persistent, $layers blocks CKPT"
"$build/agent/cli/memplan-agent" train --arch "$preset" --synthetic-data --batch "$batch" --seq "$seq" \
  --steps $steps --optimizer adamw_bf16 --n-ckpt "$layers" --clip 1.0 --lr 1e-4 \
  > "$out/memplan-train.log" 2>&1 || { tail -20 "$out/memplan-train.log"; exit 1; }
tail -4 "$out/memplan-train.log"
for conf in "" "expandable_segments:True"; do
  echo "== transformers, PYTORCH_CUDA_ALLOC_CONF='$conf'"
  PYTORCH_CUDA_ALLOC_CONF=$conf python3 scripts/hf-train-baseline.py --preset "$preset" \
    --batch "$batch" --seq "$seq" --steps $steps > "$out/hf-train${conf:+-expandable}.log" 2>&1 \
    || { tail -20 "$out/hf-train${conf:+-expandable}.log"; exit 1; }
  tail -1 "$out/hf-train${conf:+-expandable}.log"
done
