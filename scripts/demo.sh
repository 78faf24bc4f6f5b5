#!/usr/bin/env bash
# The memplan tour: sets up and builds (scripts/bootstrap.sh), starts the planner on a SQLite file
# under ./.memplan/, and walks through planning with the `memplan` CLI: presets, a plan that fits,
# an offload plan on a small card, a job that does not fit, the JSON form, a measurement feeding
# calibration, and the Prometheus metrics. Stops the planner cleanly at the end.
#
#   scripts/demo.sh
#
# Environment:
#   MEMPLAN_BUILD_DIR=DIR          build directory (default: build)
#   MEMPLAN_DEMO_SKIP_BOOTSTRAP=1  use existing binaries in the build directory as they are
#   MEMPLAN_DEMO_DIR=DIR           state directory (default: ./.memplan); the demo database there
#                                  is recreated on every run
#   MEMPLAN_NO_AGENT=1             passed to bootstrap: skip LibTorch (the tour does not need it)
set -euo pipefail
cd "$(dirname "$0")/.."
build=${MEMPLAN_BUILD_DIR:-build}
state=${MEMPLAN_DEMO_DIR:-.memplan}

bold=$'\033[1m'; dim=$'\033[2m'; reset=$'\033[0m'
[[ -t 1 ]] || { bold=; dim=; reset=; }
step=0
# step "what this shows" -- prints a numbered heading with its one-line explanation.
say_step() { step=$((step + 1)); printf '\n%s== %d. %s%s\n' "$bold" "$step" "$1" "$reset"; }
show() { printf '%s$' "$dim"; printf ' %q' "$@"; printf '%s\n' "$reset"; "$@"; }
die() { printf 'demo: %s\n' "$*" >&2; exit 1; }

if [[ ${MEMPLAN_DEMO_SKIP_BOOTSTRAP:-0} != 1 ]]; then
  scripts/bootstrap.sh "$build"
fi
planner_bin=$build/planner/daemon/memplan-planner
memplan_bin=$build/planner/cli/memplan
[[ -x $planner_bin && -x $memplan_bin ]] || die "missing $planner_bin or $memplan_bin: build first"

mkdir -p "$state"
db=$state/demo.db
log=$state/planner.log
rm -f "$db" "$db-wal" "$db-shm"

# ---------------------------------------------------------------- start the planner
# Port 0 lets the kernel pick free ports; the daemon prints the bound addresses on stdout.
"$planner_bin" --listen=127.0.0.1:0 --metrics=127.0.0.1:0 --db="$db" \
  >"$state/planner.out" 2>"$log" &
planner_pid=$!
stop_planner() {
  if kill -0 "$planner_pid" 2>/dev/null; then
    kill -TERM "$planner_pid" 2>/dev/null || true
    wait "$planner_pid" 2>/dev/null || true
  fi
}
trap stop_planner EXIT

address=; metrics=
for _ in $(seq 1 100); do
  address=$(sed -n 's/^listening on //p' "$state/planner.out" | head -n1)
  metrics=$(sed -n 's/^metrics on //p' "$state/planner.out" | head -n1)
  [[ -n $address ]] && break
  kill -0 "$planner_pid" 2>/dev/null || { cat "$log" >&2; die "the planner exited at start"; }
  sleep 0.1
done
[[ -n $address ]] || die "the planner printed no address; see $log"
memplan() { "$memplan_bin" --planner "$address" "$@"; }
# Healthy = it answers a real RPC.
for _ in $(seq 1 50); do memplan --timeout 1 presets --models >/dev/null 2>&1 && break; sleep 0.1; done
memplan --timeout 2 presets --models >/dev/null || die "the planner does not answer; see $log"

printf '%smemplan planner%s running (pid %d): gRPC %s, metrics %s, database %s, log %s\n' \
  "$bold" "$reset" "$planner_pid" "$address" "${metrics:-off}" "$db" "$log"

# ---------------------------------------------------------------- the tour
say_step "Presets: the models and GPUs the planner knows by name (a measured profile from an agent overrides a GPU preset)."
show memplan presets

say_step "Llama-3.1-8B full fine-tune on one H100 80GB at micro-batch 1 x 4096 tokens: the fastest plan that fits."
show memplan plan --arch llama-3.1-8b --gpu h100-80gb --batch 1 --seq 4096

say_step "A smaller model on an RTX 4090 (24 GB card, 64 GiB host): chunks and hidden states move to host memory; the plan says how much."
show memplan plan --arch llama-3.2-3b --gpu rtx-4090 --batch 1 --seq 4096 --max-alternatives 2

say_step "A job that does not fit: the 8B full fine-tune on the RTX 4090. The verdict says why and the smallest card that would do."
show memplan plan --arch llama-3.1-8b --gpu rtx-4090 --batch 1 --seq 4096

say_step "The same 8B model with LoRA adapters (rank 16 on every projection) instead of a full fine-tune: now it fits the RTX 4090."
show memplan plan --arch llama-3.1-8b --gpu rtx-4090 --batch 1 --seq 4096 --lora-rank 16 \
  --lora-targets all --skip-limits --max-alternatives 2

say_step "The JSON form (proto JSON of memplan.v1.PlanResponse) for scripts and schedulers; first lines only."
printf '%s$ memplan --json plan --arch llama-3.1-8b --gpu h100-80gb --batch 1 --seq 4096 | head -n 25%s\n' \
  "$dim" "$reset"
# Captured first: `| head` would end memplan with SIGPIPE, which pipefail turns into a failure.
plan_json=$(memplan --json plan --arch llama-3.1-8b --gpu h100-80gb --batch 1 --seq 4096)
head -n 25 <<<"$plan_json"
printf '  ... (%d lines in all)\n' "$(wc -l <<<"$plan_json")"

say_step "A training run reports what it measured for a plan; the planner stores it and refits its calibration."
read -r plan_id predicted < <(python3 -c '
import json, sys
r = json.load(sys.stdin)
print(r["plan_id"], r["prediction"]["peak_bytes"])' <<<"$plan_json")
# Pretend the run peaked 4 % above the prediction (the agent reports real numbers; see the hook).
measured=$((predicted * 104 / 100))
show memplan measure --plan-id "$plan_id" --peak-reserved "$measured" \
  --peak-allocated $((measured * 95 / 100)) --step-seconds 1.9 --note "demo run"

say_step "Calibration learned per (hardware, dtype, model family, method, optimizer); later plans for that key include it."
show memplan calibration
show memplan plan --arch llama-3.1-8b --gpu h100-80gb --batch 1 --seq 4096 --skip-limits \
  --max-alternatives 1

say_step "Stored plans, newest first, and one of them with its measurement."
show memplan plans list --page-size 5
show memplan plans get "$plan_id"

# ---------------------------------------------------------------- training hook
# Training with the agent, when it is built (MEMPLAN_BUILD_AGENT): memplan-agent asks the planner
# for a plan of its own, applies it, trains a few steps and reports the measurement (on a CPU-only
# host there is no device peak, so it prints predicted vs measured and says why it does not
# report). Without the agent the demo goes on. Receives the simulated run's plan id (unused).
demo_training_hook() {
  local agent_bin=$build/agent/cli/memplan-agent
  if [[ ! -x $agent_bin ]]; then
    printf '\n(no %s: the agent is not built, so no real training run here;\n' "$agent_bin"
    printf ' build with -DMEMPLAN_BUILD_AGENT=ON to see plan -> train -> report.)\n'
    return 0
  fi
  local device=cpu
  if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then device=cuda; fi
  say_step "A real training run: memplan-agent asks the planner for a plan, applies it, trains 3 steps on $device and reports."
  local args=(train --planner "$address" --arch llama-tiny --synthetic-data --steps 3
    --batch 1 --seq 128 --device "$device")
  printf '%s$ memplan-agent %s%s\n' "$dim" "${args[*]}" "$reset"
  local status=0
  "$agent_bin" "${args[@]}" 2>"$state/agent.err" || status=$?
  if [[ $status -ne 0 ]]; then
    printf 'memplan-agent exited with status %d; its log:\n' "$status"
    tail -n 20 "$state/agent.err"
  else
    printf '%s(structured step log in %s)%s\n' "$dim" "$state/agent.err" "$reset"
  fi
}
demo_training_hook "$plan_id"

if [[ -n $metrics ]]; then
  say_step "Prometheus metrics the planner exports (memplan_* series, histogram buckets left out)."
  printf '%s$ curl -s http://%s/metrics | grep ^memplan_ | grep -v _bucket%s\n' "$dim" "$metrics" "$reset"
  python3 -c '
import sys, urllib.request
text = urllib.request.urlopen("http://" + sys.argv[1] + "/metrics", timeout=5).read().decode()
for line in text.splitlines():
    if line.startswith("memplan_") and "_bucket" not in line:
        print(line)' "$metrics"
fi

say_step "Stopping the planner with SIGTERM: it drains in-flight RPCs and exits 0."
kill -TERM "$planner_pid"
status=0; wait "$planner_pid" || status=$?
trap - EXIT
[[ $status -eq 0 ]] || die "the planner exited with status $status; see $log"
printf 'planner stopped (exit 0). Database kept at %s, log at %s.\n' "$db" "$log"
printf '\nNext: memplan --help, memplan plan --help, docs/operations.md.\n'
