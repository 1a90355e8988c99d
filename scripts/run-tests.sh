#!/usr/bin/env bash
# Run every test against the real services: the Docker engine (started here if needed), an
# in-process moto server, and local agents. Extra arguments go to pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/start-docker.sh
scripts/build-images.sh
.venv/bin/ruff check runplane worker_agent functions tests bench
.venv/bin/mypy
set +e
.venv/bin/python -m pytest -p no:cacheprovider --durations=30 "$@"
rc=$?
set -e
# pytest exits 5 when nothing was collected: that is a failure here, not a pass.
[ $rc -eq 5 ] && echo "run-tests: no tests were collected" >&2
exit $rc
