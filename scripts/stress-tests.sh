#!/usr/bin/env bash
# The flake check: run the whole suite (`make test`) RUNS times in a row (default 3) from a clean
# clone of the committed tree while busy loops take every core (default: one per core), and say
# how each run ended and how long it took. A test that only passes on an idle machine fails here.
#   scripts/stress-tests.sh [RUNS]        HOGS=N to choose the number of busy loops
# Exits 0 only if every run passed. Logs stay in the printed directory.
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
root=$(pwd)
runs=${1:-3}
hogs=${HOGS:-$(nproc)}
[[ "$runs" =~ ^[1-9][0-9]*$ ]] || { echo "stress-tests: RUNS must be a positive integer, got '$runs'" >&2; exit 2; }
[[ "$hogs" =~ ^[0-9]+$ ]] || { echo "stress-tests: HOGS must be a number, got '$hogs'" >&2; exit 2; }
git -C "$root" rev-parse --git-dir >/dev/null 2>&1 || { echo "stress-tests: $root is not a git checkout" >&2; exit 2; }
if [ -n "$(git -C "$root" status --porcelain)" ]; then
  echo "stress-tests: uncommitted changes are not tested (the clone has only what is committed)" >&2
fi

work=$(mktemp -d /tmp/runplane-stress.XXXXXX)
git clone -q "$root" "$work/runplane" || { echo "stress-tests: clone failed" >&2; exit 2; }
echo "stress-tests: $runs run(s) of 'make test' in $work/runplane with $hogs busy loop(s); logs in $work"

pids=()
stop_hogs() {
  for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null; done
  wait "${pids[@]}" 2>/dev/null
  pids=()
}
trap 'stop_hogs' EXIT
trap 'stop_hogs; exit 130' INT TERM
for _ in $(seq "$hogs"); do
  bash -c 'while :; do :; done' &
  pids+=($!)
done

failed=0
summary=()
for i in $(seq "$runs"); do
  start=$(date +%s)
  (cd "$work/runplane" && CI=true make test </dev/null >"$work/run-$i.log" 2>&1)
  rc=$?
  secs=$(( $(date +%s) - start ))
  # make test's own total of its two pytest runs, else the one run's summary line
  result=$(grep -aE '^total: [0-9]+ passed' "$work/run-$i.log" | tail -1)
  [ -n "$result" ] || result=$(grep -aE '^=+ .*(passed|failed|error).* in [0-9.]+s' "$work/run-$i.log" | tail -1 | tr -d '=' | xargs)
  summary+=("run $i: exit $rc after ${secs}s: ${result:-no pytest summary}")
  echo "${summary[-1]}"
  [ "$rc" -eq 0 ] || { failed=1; grep -E '^(FAILED|ERROR) ' "$work/run-$i.log" | head -20; }
done
stop_hogs
echo "stress-tests: load average now $(cut -d' ' -f1-3 /proc/loadavg)"
printf '%s\n' "${summary[@]}"
exit $failed
