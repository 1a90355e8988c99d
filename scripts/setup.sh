#!/usr/bin/env bash
# Install what runplane needs on a Debian/Ubuntu machine (as root) and a Python venv in .venv.
# Idempotent: a second run only checks. Usage: scripts/setup.sh [--test]
set -euo pipefail
cd "$(dirname "$0")/.."
want_test=${1:-}
need=()
command -v dockerd >/dev/null || need+=(docker.io)
command -v busybox >/dev/null || [ -x /bin/busybox ] || need+=(busybox-static)
python3 -c 'import venv, ensurepip' 2>/dev/null || need+=(python3-venv)
command -v make >/dev/null || need+=(make)
if [ ${#need[@]} -gt 0 ]; then
  echo "setup: installing ${need[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq "${need[@]}" >/dev/null
fi
py=${PYTHON:-python3}
"$py" -c 'import sys; sys.exit(sys.version_info < (3, 11))' || { echo "setup: Python 3.11 or newer is needed"; exit 1; }
if [ ! -x .venv/bin/python ]; then
  "$py" -m venv .venv
fi
stamp=.venv/.installed-$( (cat pyproject.toml; echo "$want_test") | sha256sum | cut -c1-12)
if [ ! -f "$stamp" ]; then
  echo "setup: installing Python packages into .venv"
  log=$(mktemp)
  extra=""; [ "$want_test" = "--test" ] && extra="[test]"
  if ! { .venv/bin/python -m pip install -q --upgrade pip && .venv/bin/python -m pip install -q -e ".${extra}"; } >"$log" 2>&1; then
    cat "$log"; echo "setup: pip install failed"; exit 1
  fi
  rm -f "$log"
  .venv/bin/python -c 'import runplane, worker_agent, moto, docker' # fail loudly if the install did not take
  rm -f .venv/.installed-*; touch "$stamp"
fi
# Put the commands on PATH for other shells.
if [ -w /usr/local/bin ]; then
  for cmd in runplane runplane-agent; do ln -sf "$PWD/.venv/bin/$cmd" "/usr/local/bin/$cmd"; done
fi
