#!/usr/bin/env bash
# On a host with several GPUs: sharded training measured (docs/benchmarks.md, "Sharded training on
# two GPUs"). Every part runs `memplan-agent` under torchrun, one rank per GPU, NCCL.
#   scripts/gpu-multi.sh OUT_DIR BUILD_DIR [HARDWARE_NAME] [PART ...]
# PARTs (default: all, in this order; MEMPLAN_MULTI_FSDP2_MODES picks fsdp2's modes):
#   bench    memplan-agent bench on every GPU at once (NCCL all-gather / reduce-scatter bus
#            bandwidth), the profile stored in a fresh planner as HARDWARE_NAME
#   equal    one bf16 run on 1 GPU with --batch 2B against N ranks with --batch B each (the same
#            global batch, model and data): losses and grad norms of every step, for an
#            offloaded-and-sharded plan and an all-persistent (all-reduce) plan
#   scale8b  llama-3.1-8b 1x4096 per rank, planned by the planner (analytic trace), 1 GPU vs N
#   scale3b  llama-3.2-3b 2x4096 per rank (fits one GPU), 1 GPU vs N
#   zero3    llama-3.1-8b 1x4096 per rank planned with the persistent chunks' parameters sharded
#            (--persistent-params sharded, [Sharded persistent parameters]) and replicated
#            (--persistent-params replicated --persistent-state sharded)
#   budget   llama-3.1-8b 1x4096 per rank planned for a card cut to MEMPLAN_MULTI_BUDGET_GIB
#            (default 20: about FSDP2 + CPUOffloadPolicy's reserved peak; needs the bench part's
#            profile), beside fsdp2-offload
#   fsdp2    PyTorch FSDP2 (fully_shard, with and without CPUOffloadPolicy) on N GPUs, 8B 1x4096
#   big      MEMPLAN_MULTI_BIG (default qwen2.5-32b; a preset, or a config.json / its directory,
#            e.g. scripts/configs/llama-23b) 1x2048: the planner's verdict for one GPU of this host
#            (host memory binds) and N ranks training under the planner's plan
#   qlora    QLoRA over the ranks (issue 31), 1x2048 per rank: qwen3-32b r64 and llama-3.1-70b r16
#            on every linear layer (MEMPLAN_MULTI_QLORA_MODELS picks: "qwen3-32b llama-3.1-70b"),
#            planned for this card cut to MEMPLAN_MULTI_QLORA_GIB (default 24) on a host of
#            MEMPLAN_MULTI_QLORA_HOST_GIB (default 32; needs the bench part's profile): the
#            planner's verdict for 1 and N ranks, N ranks training under its plan, and qwen3-32b on
#            1 rank too where the planner says it fits; load and steady peaks per rank
# MEMPLAN_MULTI_KERNEL_TRACE=1: the scale parts also write Kineto traces of step 3 (every rank)
# and scripts/kernel-trace-summary.py's comparison of them (NAME.trace-summary.txt).
# MEMPLAN_MULTI_TIMEOUT: seconds per training run (default 300); MEMPLAN_MULTI_FSDP2_TIMEOUT: per
# FSDP2 baseline (default 300). MEMPLAN_MULTI_EQUAL: the equal part's runs to do (default all:
# "offl-1 offl-n pers-1 pers-n shard-n params-n").
# Each part is bounded by `timeout`; a part that fails leaves its log and the next one runs.
set -uo pipefail
out=${1:?out dir}; build=${2:?build dir}; hw=${3:-h100x2}
shift $(($# < 3 ? $# : 3))
parts=("$@"); ((${#parts[@]})) || parts=(bench scale8b scale3b equal fsdp2)
here=$(cd "$(dirname "$0")" && pwd)
mkdir -p "$out"
# NVLink multicast stays off on shared hosts (device tool, KINDS.md).
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
ngpu=${MEMPLAN_MULTI_GPUS:-$(nvidia-smi -L | wc -l)}
cores=$(nproc)
agent=$build/agent/cli/memplan-agent
has() { local p; for p in "${parts[@]}"; do [[ $p == "$1" ]] && return 0; done; return 1; }
say() { echo "=== [+${SECONDS}s] $*" | tee -a "$out/multi.txt"; }
ranks() {  # N CMD...: N ranks of CMD under torchrun (one node)
  local n=$1; shift
  torchrun --standalone --nproc-per-node "$n" --no-python "$@"
}
nvidia-smi --query-gpu=index,name,memory.total --format=csv,noheader | tee -a "$out/multi.txt"
nvidia-smi topo -m 2>&1 | head -8 | tee -a "$out/multi.txt"
source "$here/start-planner.sh" "$out" "$build"

if has bench; then
  say "bench: $ngpu ranks"
  timeout 240 bash -c "$(declare -f ranks); ranks $ngpu $agent bench --name $hw --planner $addr --out $out/hw.json" \
    >"$out/bench.txt" 2>&1
  echo "exit $?" >>"$out/bench.txt"
  grep -Ei "nccl|allgather|all-gather|reduce|profile_id|exit" "$out/bench.txt" | tee -a "$out/multi.txt"
fi

train() {  # NAME N_RANKS ARGS...: memplan-agent train on N ranks (1 = a plain process on GPU 0)
  local name=$1 n=$2; shift 2
  if [[ $name == equal-* && -n ${MEMPLAN_MULTI_EQUAL:-} && " $MEMPLAN_MULTI_EQUAL " != *" ${name#equal-} "* ]]; then
    return 0
  fi
  say "train $name: $n rank(s): $*"
  if ((n == 1)); then
    CUDA_VISIBLE_DEVICES=0 timeout "${MEMPLAN_MULTI_TIMEOUT:-300}" "$agent" train "$@" \
      >"$out/$name.log" 2>&1
  else
    timeout "${MEMPLAN_MULTI_TIMEOUT:-300}" bash -c "$(declare -f ranks); ranks $n $agent train $(printf '%q ' "$@")" \
      >"$out/$name.log" 2>&1
  fi
  echo "exit $?" >>"$out/$name.log"
  grep -E "msg=\"?(step|done)\"?|msg=\"load peak\"|^predicted|^measured|^plan |rank [0-9]+ (steady|chunk)|exit|rror" \
    "$out/$name.log" | sed 's/^ts=[^ ]* //' | tail -14 | tee -a "$out/multi.txt"
}


scale() {  # NAME ARCH BATCH SEQ: the planner's plan for one GPU and for N ranks
  local name=$1 arch=$2 batch=$3 seq=$4
  local args=(--planner "$addr" --hardware "$hw" --arch "$arch" --batch "$batch" --seq "$seq"
              --steps 6 --synthetic-data --device cuda)
  local t1=() tn=()
  if [[ -n ${MEMPLAN_MULTI_KERNEL_TRACE:-} ]]; then
    t1=(--kernel-trace "$out/$name-1.trace.json"); tn=(--kernel-trace "$out/$name-n.trace.json")
  fi
  train "$name-1" 1 "${args[@]}" --cpu-threads "$cores" "${t1[@]}"
  train "$name-n" "$ngpu" "${args[@]}" --cpu-threads $((cores / ngpu)) "${tn[@]}"
  if [[ -n ${MEMPLAN_MULTI_KERNEL_TRACE:-} ]]; then
    python3 "$here/kernel-trace-summary.py" "$out/$name-1.trace.json" "$out/$name-n.trace.json" \
      "$out/$name-n.trace.json.rank-1" --top 25 >"$out/$name.trace-summary.txt" 2>&1
    head -24 "$out/$name.trace-summary.txt" | tee -a "$out/multi.txt"
  fi
}
has scale8b && scale scale8b llama-3.1-8b 1 4096
has scale3b && scale scale3b llama-3.2-3b 2 4096

if has equal; then
  # Buffers only where chunks stream (an all-persistent plan refuses --n-buffer).
  common=(--arch llama-3.2-1b --seq 1024 --steps 4 --log-every 1 --synthetic-data --device cuda
          --lr 1e-4 --clip 1.0 --chunk-mib 64 --n-ckpt 8)
  per=$((cores / ngpu))
  train equal-offl-1 1 "${common[@]}" --batch $((2 * ngpu)) --n-persist 4 --n-buffer 4 --cpu-threads "$per"
  train equal-offl-n "$ngpu" "${common[@]}" --batch 2 --n-persist 4 --n-buffer 4 --cpu-threads "$per"
  train equal-pers-1 1 "${common[@]}" --batch $((2 * ngpu)) --n-persist 34 --cpu-threads "$per"
  train equal-pers-n "$ngpu" "${common[@]}" --batch 2 --n-persist 34 --cpu-threads "$per"
  # [Sharded persistent state]: the same all-persistent plan with the state sharded.
  train equal-shard-n "$ngpu" "${common[@]}" --batch 2 --n-persist 34 --cpu-threads "$per" \
    --persistent-state sharded
  # [Sharded persistent parameters]: and the parameters sharded too, gathered on use.
  train equal-params-n "$ngpu" "${common[@]}" --batch 2 --n-persist 34 --cpu-threads "$per" \
    --persistent-params sharded
fi

if has zero3; then
  z3=(--planner "$addr" --hardware "$hw" --arch llama-3.1-8b --batch 1 --seq 4096 --steps 6
      --synthetic-data --device cuda --cpu-threads $((cores / ngpu)))
  train zero3-params-n "$ngpu" "${z3[@]}" --persistent-params sharded
  train zero3-state-n "$ngpu" "${z3[@]}" --persistent-params replicated --persistent-state sharded
fi

if has budget; then
  gib=${MEMPLAN_MULTI_BUDGET_GIB:-20}
  python3 "$here/cut-profile.py" "$out/hw.json" "$out/hw-budget.json" "$hw-cut-$gib" "$gib"
  budget_id=$("$build/planner/cli/memplan" --planner "$addr" --json hardware submit "$out/hw-budget.json" \
    | python3 -c 'import json, sys; d = json.load(sys.stdin); print(d.get("profile_id") or d.get("profileId"))')
  train budget-n "$ngpu" --planner "$addr" --hardware-profile-id "$budget_id" --arch llama-3.1-8b \
    --batch 1 --seq 4096 --steps 6 --synthetic-data --device cuda --cpu-threads $((cores / ngpu))
fi

if has fsdp2; then
  for mode in ${MEMPLAN_MULTI_FSDP2_MODES:-fsdp2 fsdp2-offload}; do
    say "transformers + $mode: $ngpu ranks, llama-3.1-8b 1x4096 per rank"
    steps=(--steps 6 --warmup 2); [[ $mode == fsdp2-offload ]] && steps=(--steps 4 --warmup 1)
    timeout "${MEMPLAN_MULTI_FSDP2_TIMEOUT:-300}" torchrun --standalone --nproc-per-node "$ngpu" "$here/hf-train-baseline.py" \
      --preset llama-3.1-8b --batch 1 --seq 4096 "${steps[@]}" "--$mode" >"$out/hf-$mode.log" 2>&1
    echo "exit $?" >>"$out/hf-$mode.log"
    grep -E '^\{|exit|Error' "$out/hf-$mode.log" | tail -3 | tee -a "$out/multi.txt"
  done
fi
if has big; then
  big=${MEMPLAN_MULTI_BIG:-qwen2.5-32b}
  model=(--arch "$big")
  [[ -e $big ]] && model=(--arch-file "$big")
  for w in 1 "$ngpu"; do
    say "planner: $big 1x2048 on $w rank(s) of this host"
    "$build/planner/cli/memplan" --planner "$addr" plan "${model[@]}" --gpu "$hw" --batch 1 \
      --seq 2048 --world-size "$w" --skip-limits 2>&1 | grep -E "^(Verdict|Why|Knobs|Host|Per rank)" \
      | tee -a "$out/multi.txt"
  done
  train "big-n" "$ngpu" --planner "$addr" --hardware "$hw" "${model[@]}" --batch 1 --seq 2048 \
    --steps 3 --synthetic-data --device cuda --cpu-threads $((cores / ngpu))
  grep -E "load peak" "$out/big-n.log" | sed 's/^ts=[^ ]* //' | tee -a "$out/multi.txt"
fi
if has qlora; then
  gib=${MEMPLAN_MULTI_QLORA_GIB:-24}; host_gib=${MEMPLAN_MULTI_QLORA_HOST_GIB:-32}
  python3 "$here/cut-profile.py" "$out/hw.json" "$out/hw-qlora.json" "$hw-cut-$gib-host-$host_gib" \
    "$gib" "$host_gib"
  qlora_id=$("$build/planner/cli/memplan" --planner "$addr" --json hardware submit "$out/hw-qlora.json" \
    | python3 -c 'import json, sys; d = json.load(sys.stdin); print(d.get("profile_id") or d.get("profileId"))')
  for arch in ${MEMPLAN_MULTI_QLORA_MODELS:-qwen3-32b llama-3.1-70b}; do
    case $arch in
      qwen3-32b) lora=(--lora-rank 64 --lora-targets all --qlora); alpha=128 ;;
      *) lora=(--lora-rank 16 --lora-targets all --qlora); alpha=32 ;;
    esac
    one_fits=0
    for w in 1 "$ngpu"; do
      say "planner: $arch QLoRA ${lora[*]} 1x2048 on $w rank(s), $gib GiB cards, $host_gib GiB host"
      "$build/planner/cli/memplan" --planner "$addr" plan --arch "$arch" --hardware-id "$qlora_id" \
        --batch 1 --seq 2048 --world-size "$w" "${lora[@]}" --skip-limits >"$out/qlora-$arch-plan-$w.txt" 2>&1
      grep -E "^(Verdict|Why|Predicted|Host|Per rank)" "$out/qlora-$arch-plan-$w.txt" | tee -a "$out/multi.txt"
      ((w == 1)) && grep -qE "^Verdict +FITS" "$out/qlora-$arch-plan-1.txt" && one_fits=1
    done
    run=(--planner "$addr" --hardware-profile-id "$qlora_id" --arch "$arch" --batch 1 --seq 2048
         --steps 4 --synthetic-data --device cuda "${lora[@]}" --lora-alpha "$alpha")
    train "qlora-$arch-n" "$ngpu" "${run[@]}" --cpu-threads $((cores / ngpu))
    grep -E 'msg="(load peak|quantized base)"|rank [0-9]+ (steady|chunk memory)' "$out/qlora-$arch-n.log" \
      | sed 's/^ts=[^ ]* //' | tee -a "$out/multi.txt"
    if [[ $arch == qwen3-32b ]] && ((one_fits)); then
      train "qlora-$arch-1" 1 "${run[@]}" --cpu-threads "$cores"
      grep -E 'msg="(load peak|quantized base)"' "$out/qlora-$arch-1.log" | sed 's/^ts=[^ ]* //' \
        | tee -a "$out/multi.txt"
    fi
  done
fi
"$build/planner/cli/memplan" --planner "$addr" plans list >"$out/plans.txt" 2>&1
say "done"
