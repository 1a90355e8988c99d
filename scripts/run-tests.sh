#!/usr/bin/env bash
# Run every test against the real services: the Docker engine (started here if needed), an
# in-process moto server, and local agents. Extra arguments go to pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/start-docker.sh
scripts/build-images.sh
.venv/bin/ruff check runplane worker_agent functions tests bench
# The type check and the SAM tools' install (for the template tests, which wait for it) run beside
# the tests, which spend much of their time waiting on containers; the type check's verdict counts.
mypy_log=$(mktemp)
sam_log=$(mktemp)
# what is still running beside the tests when they end (or are interrupted) is stopped
trap 'kill $(jobs -p) 2>/dev/null || true; rm -f "$mypy_log" "$sam_log"' EXIT
.venv/bin/mypy >"$mypy_log" 2>&1 &
mypy_pid=$!
scripts/setup-sam.sh >"$sam_log" 2>&1 &
set +e
.venv/bin/python -m pytest -p no:cacheprovider --durations=30 "$@"
rc=$?
wait "$mypy_pid"
mypy_rc=$?
set -e
cat "$mypy_log"
# pytest exits 5 when nothing was collected: that is a failure here, not a pass.
[ $rc -eq 5 ] && echo "run-tests: no tests were collected" >&2
[ $mypy_rc -ne 0 ] && echo "run-tests: mypy found errors (above)" >&2 && [ $rc -eq 0 ] && rc=1
exit $rc
