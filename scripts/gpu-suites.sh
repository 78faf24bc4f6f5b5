#!/usr/bin/env bash
# On a GPU host (two GPUs for the last part): builds the agent's test suites and runs the ones that
# exercise the GPU and the host CPU's vector kernels, the CPU optimizer bench on every core, and
# gpu-multi.sh's `equal` part (one GPU vs two NCCL ranks on the same global batch: losses, peaks).
# What a refactor of agent/chunks re-runs before and after (docs/benchmarks.md).
#   scripts/gpu-suites.sh OUT_DIR [BUILD_DIR]
# Needs .gpu-debs (../shared/gpu-host/fetch-debs.sh). Writes OUT_DIR/*.log, cpubench.txt, m.tgz.
set -uo pipefail
out=${1:?usage: gpu-suites.sh OUT_DIR [BUILD_DIR]}; build=${2:-build-gpu}
mkdir -p "$out"
bash scripts/gpu-host-build.sh .gpu-debs "$build" memplan-agent memplan-planner memplan \
  chunk_manager_test cpu_adamw_test adamw8bit_test agent_blocks_test agent_quant_test \
  agent_trainer_test sharded_memory_test memplan-cpu-adam-bench > "$out/build.log" 2>&1 ||
  { tail -40 "$out/build.log"; exit 1; }
source "$build/env.sh"
echo "cpu: $(nproc) cores, $(grep -o 'avx512[a-z]*' /proc/cpuinfo | sort -u | head -3 | tr '\n' ' ')"
nvidia-smi -L
# Every test of the CPU-kernel and chunk binaries; the GPU tests of the others (their CPU tests run in CI).
run() {
  local bin=$1 filter=$2 name
  name=$(basename "$bin")
  (cd "$build" && OMP_NUM_THREADS=4 timeout 300 "tests/agent/$bin" --gtest_filter="$filter") \
    > "$out/$name.log" 2>&1
  echo "$bin rc=$? $(grep -E '^\[  (PASSED|FAILED|SKIPPED) ' "$out/$name.log" | tr '\n' ' ')"
}
for t in $(cd "$build/tests/agent" && ls chunks/*_test 2>/dev/null); do run "$t" '*'; done
run blocks/agent_blocks_test '*Gpu*'
run quant/agent_quant_test '*Gpu*'
run train/agent_trainer_test '*Gpu*'
"$build/agent/chunks/memplan-cpu-adam-bench" 67108864 "$(nproc)" > "$out/cpubench.txt" 2>&1
cat "$out/cpubench.txt"
if (($(nvidia-smi -L | wc -l) >= 2)); then
  MEMPLAN_MULTI_TIMEOUT=150 MEMPLAN_MULTI_EQUAL="offl-1 offl-n" \
    bash scripts/gpu-multi.sh "$out/m" "$build" gpux2 equal > /dev/null 2>&1
  grep -E "msg=step|peak|exit" "$out/m/multi.txt" | tail -24
  (cd "$out" && tar czf m.tgz m && rm -rf m)
fi
