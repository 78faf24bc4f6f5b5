#!/usr/bin/env bash
# Validates the deployment files offline: Prometheus config and rules (promtool), every PromQL
# expression of the Grafana dashboard (parsed by promtool as recording rules), the metric names
# they use against the planner's metrics, the systemd unit (systemd-analyze) and the Kubernetes
# manifests (YAML structure). Run from anywhere: deploy/validate.sh
set -euo pipefail
cd "$(dirname "$0")"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fail=0
ok() { printf '  ok    %s\n' "$*"; }
bad() { printf '  FAIL  %s\n' "$*"; fail=1; }
# check NAME COMMAND...: runs COMMAND quietly; prints its output only when it fails.
check() {
  local name=$1; shift
  if "$@" >"$tmp/out" 2>&1; then ok "$name"; else cat "$tmp/out"; bad "$name"; fi
}

command -v promtool >/dev/null || { echo "promtool missing (apt-get install prometheus)"; exit 2; }

check "prometheus.yml" promtool check config prometheus/prometheus.yml
check "memplan-rules.yml" promtool check rules prometheus/memplan-rules.yml

# Dashboards: JSON, then each target's PromQL as a recording rule so promtool parses it. Grafana
# variables are replaced by values that keep the expression well-formed.
python3 - "$tmp/dashboard-rules.yml" "$tmp/metrics" grafana/*.json <<'PY'
import json, re, sys
exprs = []
for path in sys.argv[3:]:
    dash = json.load(open(path))
    mine = [t["expr"] for p in dash["panels"] for t in p.get("targets", [])]
    print(f"  ok    {path}: {len(dash['panels'])} panels, {len(mine)} queries")
    exprs += mine
with open(sys.argv[1], "w") as out:
    out.write("groups:\n  - name: dashboard\n    rules:\n")
    for i, e in enumerate(exprs):
        e = e.replace("$__rate_interval", "5m").replace("$job", ".*").replace("$plan_id", ".*")
        out.write(f"      - record: dashboard:expr{i}\n        expr: {json.dumps(e)}\n")
names = set()
for e in exprs:
    names.update(re.findall(r"memplan_[a-z_]+", e))
open(sys.argv[2], "w").write("\n".join(sorted(names)) + "\n")
PY
check "dashboard PromQL" promtool check rules "$tmp/dashboard-rules.yml"

# Metric names used by the dashboard and rules must be ones the planner exports.
grep -o 'memplan_[a-z_]*' prometheus/memplan-rules.yml >>"$tmp/metrics"
exported=$(grep -ho '"memplan_[a-z_]*"' ../planner/metrics/planner_metrics.cc \
  ../agent/metrics/agent_metrics.cc | tr -d '"')
unknown=0
while read -r name; do
  [[ -z $name ]] && continue
  base=$(sed -E 's/_(bucket|count|sum)$//' <<<"$name")
  if ! grep -qx "$base" <<<"$exported"; then
    bad "metric $name is not exported by planner/metrics"; unknown=1
  fi
done < <(sort -u "$tmp/metrics")
[[ $unknown -eq 1 ]] || ok "metric names exist in planner/metrics and agent/metrics"

if command -v systemd-analyze >/dev/null; then
  # The binary need not be installed here; every other finding is an error.
  systemd-analyze verify systemd/memplan-planner.service 2>&1 \
    | grep -v 'memplan-planner is not executable' >"$tmp/out" || true
  if [[ -s $tmp/out ]]; then cat "$tmp/out"; bad "systemd unit"; else ok "systemd unit"; fi
fi

python3 - kubernetes/*.yaml <<'PY' || fail=1
import sys, yaml
for path in sys.argv[1:]:
    for doc in yaml.safe_load_all(open(path)):
        assert doc["apiVersion"] and doc["kind"] and doc["metadata"]["name"], path
    print(f"  ok    {path}")
PY
if kubectl version --request-timeout=2s >/dev/null 2>&1; then
  check "kubectl dry-run" kubectl apply --dry-run=server -f kubernetes/memplan-planner.yaml
fi
exit $fail
