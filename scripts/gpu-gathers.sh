#!/usr/bin/env bash
# On a host with several GPUs: how much of the bench's all-gather bus bandwidth the chunk gathers
# of training reach (docs/benchmarks.md, "Chunk gathers in training"). llama-3.1-8b 1x4096 per
# rank under a fixed plan that streams most chunks (the planner's own plans on an H200 keep every
# chunk on the card, so there is nothing to gather), once per chunk size and stream priority.
#   scripts/gpu-gathers.sh OUT_DIR BUILD_DIR
# MEMPLAN_GATHER_GPUS: ranks (default: every GPU); MEMPLAN_GATHER_RUNS: the runs, each
# "PRIORITY:CHUNK_MIB:N_PERSIST[:COALESCE]" (PRIORITY is MEMPLAN_NCCL_HIGH_PRIORITY: 1 high, 0
# normal; COALESCE is MEMPLAN_COALESCE_GATHERS, default 1: a hook's chunk gathers as one
# collective; default "1:64:40:1 1:64:40:0 1:256:10:1"); MEMPLAN_GATHER_BENCH_BYTES: the bench's message sizes (default
# "256M 77M"); MEMPLAN_GATHER_TIMEOUT: seconds per run (default 150).
set -uo pipefail
out=${1:?out dir}; build=${2:?build dir}
mkdir -p "$out"
# NVLink multicast stays off on shared hosts (device tool, KINDS.md).
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
n=${MEMPLAN_GATHER_GPUS:-$(nvidia-smi -L | wc -l)}
agent=$build/agent/cli/memplan-agent
threads=$(($(nproc) / n))
say() { echo "=== [+${SECONDS}s] $*" | tee -a "$out/gathers.txt"; }
nvidia-smi --query-gpu=index,name,memory.total --format=csv,noheader | tee -a "$out/gathers.txt"

# The bench's figure at its own message size (256 MiB, what the profile stores) and at a 64 MiB
# chunk's gather size (77 MiB with the padding of llama-3.1-8b's 64 MiB chunks).
for bytes in ${MEMPLAN_GATHER_BENCH_BYTES:-256M 77M}; do
  say "bench: $n ranks, all-gather / reduce-scatter of $bytes"
  timeout 300 torchrun --standalone --nproc-per-node "$n" --no-python "$agent" bench \
    --collective-bytes "$bytes" --out "$out/hw-$bytes.json" >"$out/bench-$bytes.txt" 2>&1
  echo "exit $?" >>"$out/bench-$bytes.txt"
  grep -Ei "allgather|reduce_scatter|exit" "$out/bench-$bytes.txt" | tee -a "$out/gathers.txt"
done

for run in ${MEMPLAN_GATHER_RUNS:-1:64:40:1 1:64:40:0 1:256:10:1}; do
  IFS=: read -r prio mib persist coalesce <<<"$run"
  coalesce=${coalesce:-1}
  name=gather-c${mib}-p${prio}-k${coalesce}
  say "$name: $n ranks, chunks of $mib MiB, $persist persistent, MEMPLAN_NCCL_HIGH_PRIORITY=$prio" \
    "MEMPLAN_COALESCE_GATHERS=$coalesce"
  MEMPLAN_NCCL_HIGH_PRIORITY=$prio MEMPLAN_COALESCE_GATHERS=$coalesce timeout "${MEMPLAN_GATHER_TIMEOUT:-150}" \
    torchrun --standalone --nproc-per-node "$n" --no-python "$agent" train --arch llama-3.1-8b \
    --batch 1 --seq 4096 --steps 5 --synthetic-data --device cuda --chunk-mib "$mib" \
    --n-persist "$persist" --n-buffer 6 --n-ckpt 32 --cpu-threads "$threads" >"$out/$name.log" 2>&1
  echo "exit $?" >>"$out/$name.log"
  grep -E "msg=step|chunk all-gathers|msg=\"plan applied\"|exit|rror" "$out/$name.log" |
    tee -a "$out/gathers.txt"
done
say "done"
