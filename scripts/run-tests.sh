#!/usr/bin/env bash
# Run every test against the real services: the Docker engine (started here if needed), an
# in-process moto server, and local agents. Extra arguments go to pytest.
#
# With no arguments, the whole suite runs as two pytest processes at once: the tests marked
# `engine` (tests/conftest.py: every module with a test on the Docker engine, Slurm or a local
# stack, which this machine has one of) in order, in one process, and the rest (unit tests, moto,
# Azurite, dynalite, emulators: each process starts its own) in the other. The engine's tests spend
# most of their time waiting on containers; the others use the cores meanwhile. With arguments
# (a file, -k, -m ...), one pytest process runs what they select.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/start-docker.sh
scripts/build-images.sh
.venv/bin/ruff check runplane worker_agent functions tests bench
# The type check and the SAM tools' install (for the template tests, which wait for it) run beside
# the tests, which spend much of their time waiting on containers; the type check's verdict counts.
mypy_log=$(mktemp)
sam_log=$(mktemp)
logs=$(mktemp -d)
rest_pid=""
shown=""
# What is still running beside the tests when they end (or are interrupted) is stopped: the other
# pytest with SIGINT, as Ctrl-C would, so that its fixtures stop the services they started, and
# what it printed is shown.
# shellcheck disable=SC2317 # called by the EXIT trap
finish() {
  if [ -n "$rest_pid" ] && kill -INT "$rest_pid" 2>/dev/null; then
    wait "$rest_pid" 2>/dev/null || true
  fi
  if [ -z "$shown" ] && [ -s "$logs/rest" ]; then
    echo "---- the tests beside the engine's, as far as they got ----"
    tail -n 200 "$logs/rest"
  fi
  # shellcheck disable=SC2046 # pids, one word each
  kill $(jobs -p) 2>/dev/null || true
  rm -rf "$mypy_log" "$sam_log" "$logs"
}
trap finish EXIT
.venv/bin/mypy >"$mypy_log" 2>&1 &
mypy_pid=$!
scripts/setup-sam.sh >"$sam_log" 2>&1 &
pytest=(.venv/bin/python -m pytest -p no:cacheprovider --durations=30)

# "N passed, N failed, N skipped" of a pytest run's summary line, for the total of the two
counts() {
  local line
  line=$(grep -aE '^=+ .*(passed|failed|error|skipped|no tests ran).* in [0-9.]+s' "$1" | tail -n 1)
  for word in passed failed error skipped; do
    grep -oE "[0-9]+ ${word}" <<<"$line" | cut -d' ' -f1 || echo 0
  done
}

set +e
if [ $# -eq 0 ]; then
  # a job started with & ignores SIGINT in a script: this one takes it back (see finish)
  (
    trap - INT
    exec "${pytest[@]}" -m "not engine" >"$logs/rest" 2>&1
  ) &
  rest_pid=$!
  "${pytest[@]}" -m engine 2>&1 | tee "$logs/engine"
  rc=${PIPESTATUS[0]}
  wait "$rest_pid"
  rest_rc=$?
  rest_pid=""
  echo
  echo "---- the tests beside the engine's (-m 'not engine') ----"
  cat "$logs/rest"
  shown=1
  for run in engine:$rc rest:$rest_rc; do
    [ "${run#*:}" -eq 5 ] && echo "run-tests: the ${run%%:*} tests: none were collected" >&2
  done
  [ "$rc" -eq 0 ] && rc=$rest_rc
  mapfile -t a < <(counts "$logs/engine")
  mapfile -t b < <(counts "$logs/rest")
  failed=$((a[1] + b[1] + a[2] + b[2]))
  echo "total: $((a[0] + b[0])) passed, $failed failed, $((a[3] + b[3])) skipped"
else
  "${pytest[@]}" "$@"
  rc=$?
  # pytest exits 5 when nothing was collected: that is a failure here, not a pass.
  [ $rc -eq 5 ] && echo "run-tests: no tests were collected" >&2
fi
wait "$mypy_pid"
mypy_rc=$?
set -e
cat "$mypy_log"
[ $mypy_rc -ne 0 ] && echo "run-tests: mypy found errors (above)" >&2 && [ "$rc" -eq 0 ] && rc=1
exit "$rc"
