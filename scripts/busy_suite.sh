#!/usr/bin/env bash
# The README's test command on a busy machine (issue 66): two busy-loop processes per core beside it, the load
# printed as it runs, the loops stopped however the suite ends. Usage: bash scripts/busy_suite.sh [LOOPS_PER_CORE]
set -u
per=${1:-2}
cores=$(nproc)
pids=()
for _ in $(seq $((per * cores))); do (while :; do :; done) & pids+=($!); done
trap 'kill "${pids[@]}" 2>/dev/null' EXIT
(while sleep 60; do echo "load: $(cut -d' ' -f1-3 /proc/loadavg)"; done) & pids+=($!)
echo "$((per * cores)) busy loops on $cores cores; load at the start: $(cut -d' ' -f1-3 /proc/loadavg)"
start=$SECONDS
HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 python -m pytest -q -n 2 --dist loadgroup -m "not slow"
code=$?
echo "exit $code after $((SECONDS - start)) s; load at the end: $(cut -d' ' -f1-3 /proc/loadavg)"
exit $code
