#!/usr/bin/env bash
# Issue 20's live target: `subnetact demo` defaults, 3 runs quiet, 3 with one core busy, 2 with both cores busy (one
# `yes > /dev/null` per busy core, started before the demo and killed after it). Prints one line per run (with
# SlackFit's verdict: dominated beyond trial-to-trial noise, as the demo judges it); each run's
# table is in /tmp/live_<run>.log and its results in /tmp/live_<run>/results.json. Results: docs/benchmarks.md.
#   bash benchmarks/demo_live_target.sh
set -u
cd "$(dirname "$0")/.."
run() {  # name, number of busy cores
  local name=$1 busy=$2 pids=()
  for _ in $(seq 1 "$busy"); do yes > /dev/null & pids+=($!); done
  local before; before=$(cut -d' ' -f1 /proc/loadavg)
  PYTHONPATH=$PWD timeout 600 python -m subnetact demo --out "/tmp/live_$name" > "/tmp/live_$name.log" 2>&1
  local rc=$?
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null; done
  local verdict
  verdict=$(python - "/tmp/live_$name/results.json" <<'PY' 2>/dev/null
import json, sys
d = json.load(open(sys.argv[1]))
rows = {r["policy"]: r for r in d["rows"]}
sf, mc = rows["slackfit"], rows["mincost"]
by = d["dominated_by"]["slackfit"]
print(f"slackfit {sf['slo_attainment']:.4f} / {sf['accuracy']:.2f} % (+{sf['accuracy'] - mc['accuracy']:.2f} over "
      f"mincost), dominated beyond noise by: {', '.join(by) or 'none'}")
PY
)
  echo "$name busy=$busy rc=$rc load_before=$before load_after=$(cut -d' ' -f1 /proc/loadavg) $verdict"
}
for r in quiet1 quiet2 quiet3; do run "$r" 0; done
for r in one1 one2 one3; do run "$r" 1; done
for r in both1 both2; do run "$r" 2; done
