# Sourced by the GPU scripts: starts memplan-planner on an ephemeral loopback port with its
# database in OUT, sets `addr` (host:port) and `planner_pid`, and stops the daemon on exit.
#   source scripts/start-planner.sh OUT_DIR BUILD_DIR
start_planner_out=${1:?out dir}; start_planner_build=${2:?build dir}
"$start_planner_build/planner/daemon/memplan-planner" --listen=127.0.0.1:0 --metrics= \
  --db="$start_planner_out/planner.db" >"$start_planner_out/planner.out" \
  2>"$start_planner_out/planner.log" &
planner_pid=$!
trap 'kill -TERM $planner_pid 2>/dev/null; wait $planner_pid 2>/dev/null' EXIT
addr=
for _ in $(seq 1 100); do
  addr=$(sed -n 's/^listening on //p' "$start_planner_out/planner.out"); [[ -n $addr ]] && break
  sleep 0.1
done
[[ -n $addr ]] || { echo "planner did not start"; cat "$start_planner_out/planner.log"; exit 1; }
