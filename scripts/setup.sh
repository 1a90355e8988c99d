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
if [ "$want_test" = "--test" ]; then
  # infra tests: the systemd unit, install.sh and the agent image (scripts/build-agent-image.sh)
  command -v systemd-analyze >/dev/null || need+=(systemd)
  command -v shellcheck >/dev/null || need+=(shellcheck)
  command -v debootstrap >/dev/null || need+=(debootstrap)
  # the aws CLI: the LocalStack hook's test runs the hook with it against moto (awslocal's stand-in).
  # Debian's package keeps its own botocore, apart from the venv's. (A pyenv shim with no aws behind
  # it is found by `command -v`, hence the call.)
  aws --version >/dev/null 2>&1 || need+=(awscli)
  # Azurite (the Azure Storage emulator) for the Azure adapters' tests and dynalite (DynamoDB's API,
  # with atomic conditional writes) for the AWS adapters' race tests: npm packages
  command -v npx >/dev/null || need+=(nodejs npm)
  # the dashboard's browser tests (tests/e2e/test_dashboard.py): Debian's Chromium, driven by Playwright
  [ -x /usr/bin/chromium ] || need+=(chromium)
  # private images (tests/registry.py): the distribution registry, with an htpasswd file of htpasswd's
  command -v docker-registry >/dev/null || need+=(docker-registry)
  command -v htpasswd >/dev/null || need+=(apache2-utils)
fi
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
# Azurite and dynalite (npm packages) install beside the Python packages: npm spends most of its
# time unpacking, and neither waits on the other. Each logs to a file of its own, shown if it fails,
# and runs in a process group of its own, stopped whole (npm included) if this script stops first.
npm_jobs=()
if [ "$want_test" = "--test" ]; then
  npm_logs=$(mktemp -d)
  # shellcheck disable=SC2317 # called by the EXIT trap
  stop_npm() {
    for job in "${npm_jobs[@]}"; do kill -- "-${job#*:}" 2>/dev/null || true; done
    rm -rf "$npm_logs"
  }
  trap stop_npm EXIT
  for tool in azurite dynalite; do
    setsid scripts/start-$tool.sh --install >"$npm_logs/$tool" 2>&1 & # into .$tool/; the tests start it
    npm_jobs+=("$tool:$!")
  done
fi
hash=$(sha256sum pyproject.toml | cut -c1-12)
stamp=.venv/.installed-$hash-${want_test:+test}
[ -z "$want_test" ] && [ -f ".venv/.installed-$hash-test" ] && stamp=".venv/.installed-$hash-test"  # has it all
if [ ! -f "$stamp" ]; then
  echo "setup: installing Python packages into .venv"
  log=$(mktemp)
  # `make dev`: the local stack on either cloud; the tests: every extra and the test tools
  extra="[local,azure]"; [ "$want_test" = "--test" ] && extra="[test]"
  # uv (a wheel of its own, from pip) resolves and installs them, many at once, from its cache
  if ! { .venv/bin/python -m pip install -q "uv>=0.4" &&
    .venv/bin/uv pip install -q --python .venv/bin/python -e ".${extra}"; } >"$log" 2>&1; then
    cat "$log"; echo "setup: installing the Python packages failed"; exit 1
  fi
  rm -f "$log"
  .venv/bin/python -c 'import runplane, worker_agent, moto, docker, azure.data.tables' # fail loudly if the install did not take
  rm -f .venv/.installed-*; touch "$stamp"
fi
# tests/integration/test_packaging.py installs the wheel with each extra into empty venvs, with uv
# --offline from this cache: every package of every extra, at the versions of constraints.txt.
packaging=.venv/packaging
if [ "$want_test" = "--test" ] && [ ! -f "$packaging/cache/.primed-$hash" ]; then
  echo "setup: caching the extras' packages for the packaging test"
  rm -rf "$packaging"
  log=$(mktemp)
  uv() { UV_CACHE_DIR=$packaging/cache UV_PYTHON_DOWNLOADS=never .venv/bin/uv "$@"; }
  if ! { uv venv -q --python .venv/bin/python "$packaging/venv" &&
    uv pip install -q --python "$packaging/venv/bin/python" -r pyproject.toml --extra all &&
    uv pip freeze -q --python "$packaging/venv/bin/python" >"$packaging/constraints.txt"; } >"$log" 2>&1; then
    cat "$log"; echo "setup: uv pip install failed"; exit 1
  fi
  rm -rf "$log" "$packaging/venv"
  touch "$packaging/cache/.primed-$hash"
fi
# cloud-init, for `cloud-init schema` in the tests: Debian's package unpacked into .venv/cloud-init,
# not installed. Installing it would enable its boot services, which on a real machine's next boot
# regenerate SSH host keys and rewrite network settings. Its Python dependencies are plain
# libraries, installed from Debian for the system python3 that runs it.
if [ "$want_test" = "--test" ] && ! command -v cloud-init >/dev/null && [ ! -x .venv/bin/cloud-init ]; then
  echo "setup: unpacking cloud-init into .venv/cloud-init"
  export DEBIAN_FRONTEND=noninteractive
  dl=$(mktemp -d)
  if ! (cd "$dl" && apt-get download -qq -o APT::Sandbox::User=root cloud-init) 2>/dev/null; then
    apt-get update -qq
    (cd "$dl" && apt-get download -qq -o APT::Sandbox::User=root cloud-init)
  fi
  deps=$(dpkg-deb -f "$dl"/cloud-init_*.deb Depends | tr ',' '\n' | grep -o 'python3-[a-z0-9.-]*' | sort -u)
  # shellcheck disable=SC2086 # a list of package names
  apt-get install -y -qq --no-install-recommends $deps >/dev/null
  rm -rf .venv/cloud-init
  dpkg-deb -x "$dl"/cloud-init_*.deb .venv/cloud-init
  rm -rf "$dl"
  cat >.venv/bin/cloud-init <<WRAPPER
#!/bin/sh
# Debian's cloud-init, unpacked by scripts/setup.sh (not installed: no services, no boot hooks).
PYTHONPATH="$PWD/.venv/cloud-init/usr/lib/python3/dist-packages" exec /usr/bin/python3 "$PWD/.venv/cloud-init/usr/bin/cloud-init" "\$@"
WRAPPER
  chmod +x .venv/bin/cloud-init
  .venv/bin/cloud-init --version >/dev/null # fail loudly if it does not run
fi
# Put the commands on PATH for other shells.
if [ -w /usr/local/bin ]; then
  for cmd in runplane runplane-agent; do ln -sf "$PWD/.venv/bin/$cmd" "/usr/local/bin/$cmd"; done
fi
for job in "${npm_jobs[@]}"; do
  if ! wait "${job#*:}"; then
    cat "$npm_logs/${job%%:*}"; echo "setup: installing ${job%%:*} failed"; exit 1
  fi
done
npm_jobs=() # all done: nothing for the trap to stop
